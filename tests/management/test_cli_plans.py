"""``manage.py workflows list`` and ``show`` reach runs through indexes, on a table of finished history.

20,000 finished runs (an attempt, an event and a signal each) stand for the history that dominates a
real table, next to a few runs of interest; with the statistics fresh, the planner chooses
freely (no setting turned off), and no query of the command may read a workflow table
sequentially or count it.
"""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.management.test_cli import paused_on_error, ready, waiting, wid
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

HISTORY = 20_000

CLASS_INDEX = "pgbus_wf_run_class_status"

TABLES = {f"pgbus_workflows_{name}" for name in ("workflowrun", "workflowstep", "workflowevent", "workflowsignal")}

#: Finished runs of five classes, each with a completed attempt, an event and a consumed signal.
FILL = [
    """INSERT INTO pgbus_workflows_workflowrun (workflow_id, workflow_class, status, current_step, arguments,
         allow_multiple, paused_reason, created_at, started_at, finished_at, status_changed_at)
       SELECT gen_random_uuid(), 'history_' || (n %% 5), 'finished', 'last', '{}', false, '', now(), now(), now(), now()
       FROM generate_series(1, %s) AS n""",
    """INSERT INTO pgbus_workflows_workflowstep (run_id, step_name, attempt, status, outcome, reattempt_reason,
         queue, priority, scheduled_at, claimed_by, error_class, error_message, traceback, timed_out, created_at)
       SELECT id, 'last', 1, 'completed', 'success', '', 'workflows', 0, now(), '', '', '', '', false, now()
       FROM pgbus_workflows_workflowrun WHERE workflow_class LIKE 'history%%'""",
    """INSERT INTO pgbus_workflows_workflowevent (run_id, kind, transition, from_status, to_status, actor, reason,
         details, created_at)
       SELECT id, 'finished', 'finish', 'performing', 'finished', 'system', '', '{}', now()
       FROM pgbus_workflows_workflowrun WHERE workflow_class LIKE 'history%%'""",
    """INSERT INTO pgbus_workflows_workflowsignal (run_id, name, payload, status, actor, reason, received_at)
       SELECT id, 'approved', '{}', 'consumed', 'webhook', '', now()
       FROM pgbus_workflows_workflowrun WHERE workflow_class LIKE 'history%%'""",
]


@pytest.fixture
def history():
    with connection.cursor() as cursor:
        for statement in FILL:
            cursor.execute(statement, [HISTORY] if "%s" in statement else [])


def analyze():
    with connection.cursor() as cursor:
        for table in sorted(TABLES):
            cursor.execute(f"ANALYZE {table}")


def plan_nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def queries_of(*args):
    """Run the command; returns its output and, per query it sent, the text and the plan's nodes."""
    out = StringIO()
    with CaptureQueriesContext(connection) as captured:
        call_command("workflows", *args, stdout=out)
    plans = []
    for query in captured.captured_queries:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + query["sql"])
            plans.append((query["sql"], list(plan_nodes(cursor.fetchone()[0][0]["Plan"]))))
    return out.getvalue(), plans


def assert_indexed(plans):
    for sql, nodes in plans:
        # No count of a table; the one count is of a run's own children (child workflows), by their index.
        assert "COUNT(" not in sql.upper() or '."parent_id" = ' in sql, sql
        scans = [(n["Node Type"], n.get("Relation Name")) for n in nodes]
        assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in TABLES], (sql, scans)


def indexes_used(plans):
    return {n.get("Index Name") for _sql, nodes in plans for n in nodes} - {None}


def status_conditions(plans):
    """The conditions on status of every scan of the (class, status) index."""
    conditions = [n.get("Index Cond", "") for _sql, nodes in plans for n in nodes if n.get("Index Name") == CLASS_INDEX]
    return [condition for condition in conditions if "status" in condition]


def test_every_filter_reaches_its_runs_through_an_index(history):
    order = Order.objects.create()
    paused = [paused_on_error(order), paused_on_error()]
    parked, due = waiting(), ready()
    analyze()

    cases = [
        ((), [due, parked, *reversed(paused)][:3], "pgbus_workflows_workflowrun_pkey"),
        (("--status", "paused"), list(reversed(paused)), CLASS_INDEX),
        (("--status", "waiting", "--status", "ready"), [due, parked], CLASS_INDEX),
        (("--stuck", "paused_on_error"), list(reversed(paused)), CLASS_INDEX),
        (("--stuck", "stalled"), [], "pgbus_wf_step_in_progress"),
        (("--subject", f"testapp.order:{order.pk}"), [paused[0]], "pgbus_wf_run_subject"),
        # either index that a class leads serves a class alone (the insights' one also orders by start)
        (("--class", "fails_first"), list(reversed(paused)), (CLASS_INDEX, "pgbus_wf_run_class_started")),
    ]
    for args, expected, index in cases:
        out, plans = queries_of("list", "--json", "--limit", "3", *args)
        assert [row["workflow_id"] for row in json.loads(out)] == [wid(wf) for wf in expected], args
        assert_indexed(plans)
        accepted = set(index) if isinstance(index, tuple) else {index}
        assert accepted & indexes_used(plans), (args, indexes_used(plans))
        # Status is the index's second column: a scan that does not name the class first reads all of it.
        assert all("workflow_class" in condition for condition in status_conditions(plans)), args


def test_show_reads_one_run_its_attempts_events_and_signals_by_index(history):
    wf = paused_on_error()
    analyze()
    _out, plans = queries_of("show", wid(wf)[:8])
    assert_indexed(plans)
    used = indexes_used(plans)
    assert {"pgbus_workflows_workflowrun_workflow_id_key", "pgbus_wf_step_run_name", "pgbus_wf_event_run"} <= used
    assert "pgbus_wf_run_children" in used, used
