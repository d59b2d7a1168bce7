"""Behind a long history, a claim reads its due range, never the steps waiting for later; the gauge too.

``scheduled_at``'s statistics cover every attempt ever made. With most of them finished, all
due in the past, PostgreSQL expected nearly every step waiting days to be due, and a
dispatcher's prepared claim read them all through another index (0.7 s a claim behind
10,000,000 finished runs and 1,000,000 waiting, docs/benchmarks.md). The due index is keyed
on the due time of a scheduled attempt alone, an expression with statistics of its own
(``sql.due``, migration 0027).
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from psycopg import sql as psql

from bench.scale_fill import Copies, copy_run
from pgbus_workflows import sql
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.stuck import stuck_querysets
from pgbus_workflows.sql import clock
from pgbus_workflows.sql.counting import oldest_due_at
from tests.sql.test_query_plans import TABLES, nodes, run_steps_as_a_worker, start_elsewhere
from tests.testapp.workflows import ThreeSteps, Waits

pytestmark = pytest.mark.django_db(transaction=True)

FINISHED, WAITING = 10_000, 1_000  # enough for the walk: 1,000 rows filtered out per priority


def analysed() -> None:
    """The runs' and the steps' statistics made fresh, as autovacuum would."""
    with connection.cursor() as cursor:
        for name in TABLES:
            cursor.execute(psql.SQL("ANALYZE {}").format(psql.Identifier(name)).as_string(None))


def long_history() -> None:
    """``FINISHED`` three-step runs ended over ten days, ``WAITING`` runs waiting three days and more; analysed."""
    finished = ThreeSteps.start()
    waiting = Waits.start()
    run_steps_as_a_worker()  # the first finishes, the second waits for its next step
    copy_run(Copies(finished.record.pk, FINISHED, "history", spread_seconds=10 * 86400))
    copy_run(Copies(waiting.record.pk, WAITING, Waits.name, spread_seconds=3600, due_in_seconds=3 * 86400))
    later = WorkflowStep.objects.filter(run=waiting.record, status="scheduled")
    later.update(scheduled_at=clock.now() + timedelta(days=3))  # the template waits with its copies
    analysed()


def test_a_prepared_claim_and_the_oldest_due_step_read_the_due_index_behind_a_long_history(monkeypatch, executed_plans):
    long_history()
    monkeypatch.setattr(sql, "_prepared_at", set())
    connection.ensure_connection()
    sql.prepare_statements(connection.connection)  # a dispatcher's generic plans, kept for the connection
    start_elsewhere(8)
    executed_plans.clear()

    assert run_steps_as_a_worker() == 24

    claims = [plan for plan in executed_plans if "CTE due" in plan]
    assert len(claims) == 9, executed_plans[:3]
    for plan in claims:
        due = plan[plan.index("CTE due") : plan.index("CTE known")]
        assert "Index Scan using pgbus_wf_step_due" in due, due
        assert "pgbus_wf_one_active_step_per_run" not in due, due
    assert WorkflowStep.objects.filter(run__workflow_class=Waits.name, status="scheduled").count() == WAITING + 1

    start_elsewhere(1)
    executed_plans.clear()
    due = oldest_due_at(clock.now())  # the health report's, planned for its values

    (plan,) = [plan for plan in executed_plans if "WITH RECURSIVE priorities(p)" in plan]
    assert "Index Scan using pgbus_wf_step_due" in plan and "pgbus_wf_one_active_step_per_run" not in plan, plan
    assert due is not None and clock.now() - due < timedelta(minutes=1)


def test_the_gauges_overdue_runs_are_read_from_the_overdue_steps_not_from_every_ready_run():
    # Ready runs waiting days behind a history of attempts all due in the past: reading each
    # one's step cost 1.4 s behind 1,000,000 of them and 10,000,000 finished runs.
    finished, waiting = ThreeSteps.start(), Waits.start()
    run_steps_as_a_worker()
    copy_run(Copies(finished.record.pk, 20_000, "history", spread_seconds=10 * 86400))
    copy_run(Copies(waiting.record.pk, 5_000, Waits.name, spread_seconds=3600, due_in_seconds=3 * 86400))
    WorkflowStep.objects.filter(run=waiting.record, status="scheduled").update(
        scheduled_at=clock.now() + timedelta(days=3)
    )
    late = [ThreeSteps.start() for _ in range(3)]
    WorkflowStep.objects.filter(run__in=[wf.record for wf in late]).update(
        scheduled_at=clock.now() - timedelta(hours=1)
    )
    analysed()
    overdue = stuck_querysets(clock.now())["overdue"].values_list("workflow_class").annotate(n=Count("pk")).order_by()

    text, params = overdue.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text, params)
        plan = cursor.fetchone()[0][0]["Plan"]
    walked = [(n["Node Type"], n.get("Index Name"), n["Actual Rows"] * n["Actual Loops"]) for n in nodes(plan)]
    assert max(rows for _, _, rows in walked) < 1000, walked
    assert list(overdue) == [(ThreeSteps.name, 3)]
