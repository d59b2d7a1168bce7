"""Every admin list and the dashboard reach their rows through indexes, on tables of finished history.

30,000 finished runs of five classes (three completed attempts, three events and a consumed
signal each, and fan-out jobs) stand for the history that dominates a real table, next to a
few runs of interest made by the engine; with the statistics fresh, the planner chooses
freely (no setting turned off). Each page is fetched through the admin as a superuser, and
every query it sent is run with EXPLAIN ANALYZE: none may read a workflow table
sequentially, walk an index through more rows than a bounded count reads, or list a
table's distinct values.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from tests.management.test_cli import paused_on_error, ready, waiting
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

HISTORY = 30_000
#: The most rows one scan of a hot table may go through: the bounded counts (up to 1,001 rows,
#: the gauge's up to 10,001 for one class and status) fit; reading the history does not.
MAX_ROWS_READ = 12_000

HOT = {m._meta.db_table for m in (WorkflowRun, WorkflowStep, WorkflowEvent, WorkflowSignal, FanOutJob)} | {
    "pgbus_workflows_scheduleevent"
}

RUNS, STEPS, EVENTS, SIGNALS, JOBS = (
    m._meta.db_table for m in (WorkflowRun, WorkflowStep, WorkflowEvent, WorkflowSignal, FanOutJob)
)

#: Finished runs of five classes spread over the last 300 days, with their history.
FILL = [
    f"""INSERT INTO {RUNS} (workflow_id, workflow_class, status, current_step, arguments, allow_multiple,
          paused_reason, created_at, started_at, finished_at, status_changed_at, subject_type, subject_id,
          idempotency_key)
        SELECT gen_random_uuid(), 'history_' || (n %% 5), 'finished', 'c', '{{}}', false, '',
               now() - n * interval '15 minutes', now() - n * interval '15 minutes',
               now() - n * interval '15 minutes', now() - n * interval '15 minutes',
               'testapp.order', 'h' || n, 'key-' || n
        FROM generate_series(1, %s) AS n""",
    f"""INSERT INTO {STEPS} (run_id, step_name, attempt, status, outcome, reattempt_reason, queue, priority,
          scheduled_at, started_at, finished_at, claimed_by, error_class, error_message, traceback, timed_out,
          created_at)
        SELECT r.id, s.name, 1, 'completed', 'success', '', 'workflows', 0, r.created_at, r.created_at,
               r.created_at, '', '', '', '', false, r.created_at
        FROM {RUNS} r CROSS JOIN (VALUES ('a'), ('b'), ('c')) AS s(name) WHERE r.workflow_class LIKE 'history%%'""",
    f"""INSERT INTO {EVENTS} (run_id, kind, transition, from_status, to_status, actor, reason, details, created_at)
        SELECT r.id, e.kind, '', '', '', '', '', '{{}}', r.created_at
        FROM {RUNS} r CROSS JOIN (VALUES ('step_started'), ('step_completed'), ('finished')) AS e(kind)
        WHERE r.workflow_class LIKE 'history%%'""",
    f"""INSERT INTO {SIGNALS} (run_id, name, payload, status, actor, reason, received_at)
        SELECT id, 'approved', '{{}}', 'consumed', 'webhook', '', created_at
        FROM {RUNS} WHERE workflow_class LIKE 'history%%'""",
    f"""INSERT INTO {JOBS} (step_id, run_id, index, function, arguments, status, attempts, max_attempts, stalls,
          queue, priority, scheduled_at, finished_at, claimed_by, error)
        SELECT s.id, s.run_id, 0, 'tests.testapp.jobs.square', '{{}}', 'succeeded', 1, 1, 0, 'workflows', 0,
               s.created_at, s.created_at, '', ''
        FROM {STEPS} s WHERE s.step_name = 'c' AND s.run_id %% 3 = 0""",
]


def analyze() -> None:
    with connection.cursor() as cursor:
        for table in sorted(HOT):
            cursor.execute(f"ANALYZE {table}")


@pytest.fixture(scope="module")
def committed_history(django_db_setup, django_db_blocker):
    """The history and the runs of interest, committed once for the module's tests, emptied after them.

    Each test runs in a transaction rolled back at its end, so none sees another's changes.
    """
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            for statement in FILL:
                cursor.execute(statement, [HISTORY] if "%s" in statement else [])
        order = Order.objects.create()
        runs = {"paused": paused_on_error(order), "waiting": waiting(), "ready": ready()}
    yield runs
    with django_db_blocker.unblock():
        call_command("flush", verbosity=0, interactive=False)


@pytest.fixture
def history(committed_history, db):
    """The history, with the planner's statistics of it fresh in the test's transaction.

    The ANALYZE is rolled back with the test, as the flush leaves statistics alone: committed,
    the history's statistics would stay on the emptied tables for the rest of the suite.
    """
    analyze()
    return committed_history


def plan_nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explained(queries):
    """(sql, executed plan nodes) of every SELECT a page sent (its own EXPLAINs are already plans)."""
    for query in queries:
        sql = query["sql"]
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            yield sql, list(plan_nodes(cursor.fetchone()[0][0]["Plan"]))


def rows_read(node) -> float:
    """Rows one loop of a scan node went through: those it returned and those its filter dropped."""
    return node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)


def assert_indexed(url, queries):
    checked = 0
    for sql, nodes in explained(queries):
        if not any(table in sql for table in HOT):
            continue
        checked += 1
        scans = [(n["Node Type"], n.get("Relation Name")) for n in nodes]
        assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in HOT], (url, sql, scans)
        # An index walk that filters its way through the history is a scan too.
        walks = [(n["Node Type"], n.get("Index Name"), rows_read(n)) for n in nodes if n.get("Relation Name") in HOT]
        assert not [w for w in walks if w[2] > MAX_ROWS_READ], (url, sql, walks)
        assert "SELECT DISTINCT" not in sql.upper(), (url, sql)  # a COUNT(DISTINCT) of a bounded set is no listing
    assert checked or url == changelist("dispatcher"), url  # the dispatchers' list reads no hot table


def fetch(client, url):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response, captured.captured_queries


def changelist(model, query=""):
    return reverse(f"admin:pgbus_workflows_{model}_changelist") + query


def test_every_list_filter_search_and_page_is_served_by_indexes(admin_client, history):
    paused = history["paused"].record
    step = WorkflowStep.objects.filter(run=paused).first()
    job_step = FanOutJob.objects.values_list("step_id", flat=True).first()
    prefix = str(paused.workflow_id)[:8]
    urls = [
        changelist("workflowrun"),
        changelist("workflowrun", "?p=3"),
        changelist("workflowrun", "?o=1"),
        changelist("workflowrun", "?o=-4.9.6"),  # columns without an index: not sorted by
        changelist("workflowrun", "?workflow_class=history_1"),
        changelist("workflowrun", "?status=paused"),
        changelist("workflowrun", "?status=finished"),
        changelist("workflowrun", "?status=paused&workflow_class=fails_first"),
        *(changelist("workflowrun", f"?stuck={r}") for r in ("stalled", "overdue", "waiting_overdue")),
        changelist("workflowrun", "?stuck=paused_on_error"),
        changelist("workflowrun", "?stuck=fan_out_unresolved"),
        changelist("workflowrun", f"?q={prefix}"),
        changelist("workflowrun", f"?q={paused.workflow_id}"),
        changelist("workflowrun", "?q=h77"),
        changelist("workflowrun", "?q=key-77"),
        changelist("workflowrun", "?schedule__id__exact=1"),
        changelist("workflowstep"),
        changelist("workflowstep", "?workflow_class=history_2"),
        *(changelist("workflowstep", f"?status__exact={s}") for s in ("failed", "completed", "scheduled", "waiting")),
        changelist("workflowstep", "?finished_within=1h"),
        changelist("workflowstep", "?finished_within=24h&status__exact=failed&workflow_class=fails_first"),
        changelist("workflowstep", f"?run__id__exact={paused.pk}"),
        changelist("workflowstep", f"?q={prefix}"),
        changelist("workflowevent"),
        changelist("workflowevent", "?kind=step_failed"),
        changelist("workflowevent", f"?run__id__exact={paused.pk}"),
        changelist("workflowevent", f"?q={prefix}"),
        changelist("workflowsignal"),
        changelist("workflowsignal", "?status__exact=pending"),
        changelist("workflowsignal", f"?q={prefix}"),
        changelist("fanoutjob"),
        *(changelist("fanoutjob", f"?status__exact={s}") for s in ("failed", "pending", "running")),
        changelist("fanoutjob", f"?step__id__exact={job_step}"),
        changelist("fanoutjob", f"?q={prefix}"),
        changelist("dispatcher"),
        changelist("workflowschedule"),
        reverse("admin:pgbus_workflows_workflowrun_dashboard"),
        reverse("admin:pgbus_workflows_workflowstep_change", args=[step.pk]),
    ]
    for url in urls:
        _response, queries = fetch(admin_client, url)
        assert_indexed(url, queries)


def test_a_search_for_a_run_the_planners_histogram_names_is_served_by_indexes_too(admin_client, history):
    # A range of UUIDs that holds one of the histogram's bounds (about one run in 300) was
    # guessed at 0.5 % of all runs: the lists of a run's rows then read their table whole.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT histogram_bounds::text::uuid[] FROM pg_stats WHERE tablename = %s AND attname = 'workflow_id'",
            [RUNS],
        )
        (bounds,) = cursor.fetchone()
    # Runs of the history (a signal each); the bounds may also name one of the three runs
    # made apart (a failed, a waiting and a ready one), which have no signal.
    in_history = set(
        WorkflowRun.objects.filter(workflow_id__in=bounds, workflow_class__startswith="history_").values_list(
            "workflow_id", flat=True
        )
    )
    named = [str(workflow_id) for workflow_id in bounds[1:-1] if workflow_id in in_history][::20][:5]
    assert len(named) == 5
    for workflow_id in named:
        run = WorkflowRun.objects.get(workflow_id=workflow_id).pk
        for model in ("workflowrun", "workflowstep", "workflowevent", "workflowsignal", "fanoutjob"):
            url = changelist(model, f"?q={workflow_id[:8]}")
            response, queries = fetch(admin_client, url)
            assert_indexed(url, queries)
            found = {
                row.pk if model == "workflowrun" else row.run_id for row in response.context_data["cl"].result_list
            }
            assert found == {run} or (model == "fanoutjob" and not found), (url, found)  # a job for one run in three


def test_the_filters_and_searches_still_find_their_rows(admin_client, history):
    paused = history["paused"].record

    def shown(model, query):
        response, _queries = fetch(admin_client, changelist(model, query))
        return {row.pk for row in response.context["cl"].result_list}

    assert shown("workflowrun", "?status=paused") == {paused.pk}
    assert shown("workflowrun", "?stuck=paused_on_error") == {paused.pk}
    assert shown("workflowrun", f"?q={str(paused.workflow_id)[:8]}") == {paused.pk}
    assert len(shown("workflowrun", "?q=h77")) == 1
    assert len(shown("workflowrun", "?q=key-77")) == 1
    assert {s.run_id for s in WorkflowStep.objects.filter(pk__in=shown("workflowstep", "?status__exact=failed"))} == {
        paused.pk
    }
    kinds = WorkflowEvent.objects.filter(pk__in=shown("workflowevent", "?kind=step_failed")).values_list(
        "run", flat=True
    )
    assert set(kinds) == {paused.pk}
    pending = WorkflowSignal.objects.filter(pk__in=shown("workflowsignal", "?status__exact=pending"))
    assert all(signal.status == "pending" for signal in pending)


def test_the_gauge_reads_the_runs_through_indexes(history):
    from pgbus_workflows.services.stuck import gauge
    from pgbus_workflows.sql import clock

    with CaptureQueriesContext(connection) as captured:
        data = gauge(clock.now())
    assert_indexed("gauge", captured.captured_queries)
    counts = {(row["workflow_class"], row["status"]): row["count"] for row in data["statuses"]}
    assert counts[("history_1", "finished")] == HISTORY // 5
    assert counts[("fails_first", "paused")] == 1


def test_the_dashboards_last_hour_is_read_off_the_finished_at_index(admin_client, history):
    _response, queries = fetch(admin_client, reverse("admin:pgbus_workflows_workflowrun_dashboard"))
    used = {n.get("Index Name") for sql, nodes in explained(queries) if "finished_at" in sql for n in nodes}
    assert "pgbus_wf_step_finished" in used


@pytest.mark.parametrize("window", ["1h", "24h", "7d"])
def test_the_insights_page_is_served_by_indexes_bounded_by_its_window(admin_client, history, window):
    paused = history["paused"].record.workflow_class
    for workflow_class in ("history_1", paused):
        url = reverse("admin:pgbus_workflows_insights", args=[workflow_class]) + f"?window={window}"
        _response, queries = fetch(admin_client, url)
        assert_indexed(url, queries)
        used = {n.get("Index Name") for _sql, nodes in explained(queries) for n in nodes}
        assert "pgbus_wf_step_finished" in used, used  # the window's attempts, whatever the class
        if workflow_class == "history_1":  # a class with history: its window of starts
            assert "pgbus_wf_run_class_started" in used, used
        else:  # a class of a few ongoing runs: the planner may read them by any index its class leads
            assert used & {"pgbus_wf_run_pipeline", "pgbus_wf_run_class_status", "pgbus_wf_run_class_started"}, used
