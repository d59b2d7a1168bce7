"""A run's admin page reaches its rows through indexes, on tables of finished history.

20,000 finished runs (an attempt, an event, a signal and a fan-out job each, ``test_cli_plans``'s
history plus jobs) stand for the history a real table holds, next to one long run of interest
(``fill_run``: 200 attempts, 500 events, 60 signals, 20 fan-outs). With the statistics fresh
the planner chooses freely (no setting turned off); no query the page sends may read a
workflow table sequentially, and its counts are counts within the run.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.admin.test_admin_run_page import fill_run
from tests.management.test_cli_plans import TABLES, analyze, history, plan_nodes  # noqa: F401 (history: a fixture)
from tests.support import VIEW, run_page, staff_user
from tests.testapp.workflows import Squares

pytestmark = pytest.mark.django_db

JOBS = "pgbus_workflows_fanoutjob"

#: A finished fan-out job for every attempt of the history.
HISTORY_JOBS = f"""INSERT INTO {JOBS} (step_id, run_id, index, function, arguments, status, attempts, max_attempts,
      stalls, queue, priority, scheduled_at, claimed_by, error)
    SELECT id, run_id, 0, 'tests.testapp.jobs.square', '{{}}', 'succeeded', 1, 1, 0, 'workflows', 0, now(), '', ''
    FROM pgbus_workflows_workflowstep WHERE step_name = 'last'"""


def page_plans(client, url: str) -> list[tuple[str, list[dict]]]:
    """Each query of the run page on a workflow table, with the nodes of its plan."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    plans = []
    for query in captured.captured_queries:
        if not any(table in query["sql"] for table in (*TABLES, JOBS)):
            continue  # the session, the user, the permissions
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + query["sql"])
            plans.append((query["sql"], list(plan_nodes(cursor.fetchone()[0][0]["Plan"]))))
    return plans


@pytest.mark.usefixtures("history")
@pytest.mark.parametrize("page", [{}, {"steps_page": "5", "events_page": "12", "signals_page": "3"}])
def test_the_run_page_reads_its_run_s_rows_by_index_on_every_page(client, django_user_model, page):
    wf = Squares.start(count=3)
    fill_run(wf)
    with connection.cursor() as cursor:
        cursor.execute(HISTORY_JOBS)
    analyze()
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {JOBS}")
    client.force_login(staff_user(django_user_model, "ivy", *VIEW))
    query = "&".join(f"{key}={value}" for key, value in page.items())

    plans = page_plans(client, f"{run_page(wf)}?{query}")

    scans = [(n["Node Type"], n.get("Relation Name")) for _sql, nodes in plans for n in nodes]
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in (*TABLES, JOBS)], scans
    used = {n.get("Index Name") for _sql, nodes in plans for n in nodes} - {None}
    assert {"pgbus_wf_step_run_name", "pgbus_wf_event_run", "pgbus_wf_one_active_step_per_run"} <= used, used
    # Django's own indexes of the foreign keys: the signals' run, the jobs' attempt.
    for prefix in ("pgbus_workflows_workflowsignal_run_id", "pgbus_workflows_fanoutjob_step_id"):
        assert any(name.startswith(prefix) for name in used), (prefix, used)
    counts = [sql for sql, _nodes in plans if "COUNT(" in sql.upper()]
    # Each count is within the run (its rows), or of its children (child workflows, by the children's index).
    assert counts and all('."run_id" = ' in sql or '."parent_id" = ' in sql for sql in counts), counts
    assert "pgbus_wf_run_children" in used, used
