"""The capacity page's counts (``bench.capacity``): what one ``start()`` and one signal cost the primary.

``docs/explanation/capacity.md`` says a start is one round trip, one statement and one commit;
these hold the page's cheapest rows to the code, so a change that adds a round trip fails here
as well as in the table ``bench.run_all`` prints.
"""

import pytest

from bench.capacity import counted
from tests.testapp.workflows import NoOp3

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def walinspect():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'")
        if not cursor.fetchone()[0]:
            pytest.skip("pg_walinspect (PostgreSQL 15+) is not available on this server")


def vacuumed() -> None:
    """Prune the dead rows earlier tests left (rolled back): the next writes would prune them, in their WAL."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            if table.startswith("pgbus_workflows_"):
                cursor.execute(f"VACUUM {connection.ops.quote_name(table)}")


def test_a_start_is_one_round_trip_one_statement_and_one_commit_of_a_few_kilobytes():
    vacuumed()
    NoOp3.start()  # the process's first start reads the server's clock and looks its function up
    rounds = []
    for _ in range(3):
        with counted(10) as cost:
            for _ in range(10):
                NoOp3.start()
        per = cost().per()
        assert (per["round trips"], per["statements"], per["commits"]) == (1, 1, 1)
        rounds.append(per)
    # The least of three rounds: an index page split now and then adds its records to one round.
    least = min(per["WAL bytes"] for per in rounds)
    assert 500 < least < 5000, rounds


def test_reads_commit_nothing_and_write_no_wal():
    NoOp3.find("00000000-0000-0000-0000-000000000000")
    with counted(5) as cost:
        for _ in range(5):
            assert NoOp3.find("00000000-0000-0000-0000-000000000000") is None
    found = cost()
    assert (found.round_trips, found.statements, found.commits, found.wal_bytes) == (5, 5, 0, 0)
