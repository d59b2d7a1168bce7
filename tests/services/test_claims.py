"""The dispatcher's claim: what it takes, what it sees beyond (the look-ahead), and how it is sent.

``claim_and_look_ahead`` is what the dispatcher's loop calls: the due steps it claims, and in the
same round trip when the loop must look again (the earliest step or job due later) and whether
a fan-out job is due now (when not, the loop sends no job claim at all).
"""

from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from pgbus_workflows import signals, sql
from pgbus_workflows.conf import settings
from pgbus_workflows.models import Dispatcher, FanOutJob, WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_and_look_ahead, claim_due_steps, claim_step, still_in_progress
from pgbus_workflows.services.executor import execute_step
from tests.procs import DispatcherProcess, eventually
from tests.testapp.workflows import NoOp3, Squares

pytestmark = pytest.mark.django_db(transaction=True)


def scheduled_step(wf):
    return WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled")


def test_the_claim_takes_what_is_due_and_tells_when_the_next_step_is_due():
    due, later = NoOp3.start(), NoOp3.start()
    at = timezone.now() + timedelta(seconds=30)
    WorkflowStep.objects.filter(run_id=later.record.pk).update(scheduled_at=at)

    steps, ahead = claim_and_look_ahead(4, claimed_by="d")

    assert [s.run_id for s in steps] == [due.record.pk]
    assert steps[0].status == "in_progress" and steps[0].run.status == "performing"
    assert ahead.next_due_at == at
    assert not ahead.jobs_due


def claimed_rows(step_pk):
    """A claimed attempt, its run and its ``step_started`` event, as plain values: keys dropped, times
    given from the claim's moment (the attempt's ``started_at``)."""
    step = WorkflowStep.objects.get(pk=step_pk)
    run, event = step.run, WorkflowEvent.objects.get(step=step, kind="step_started")
    at = step.started_at

    def plain(row, *keys):
        values = {f.attname: getattr(row, f.attname) for f in type(row)._meta.concrete_fields if f.attname not in keys}
        return {name: value - at if name.endswith("_at") and value else value for name, value in values.items()}

    return (
        plain(step, "id", "run_id", "created_at", "scheduled_at"),
        plain(run, "id", "workflow_id", "created_at", "started_at"),
        plain(event, "id", "run_id", "step_id"),
    )


def test_the_claim_statement_writes_what_the_ledger_claim_writes_and_says_so_after_commit():
    # The dispatcher claims with one statement; a test helper or run_now claims a step through
    # the run's ledger. Both must leave the same rows and send the same signal, once committed.
    sent = []

    def receiver(sender, signal, **kwargs):
        sent.append((sender, kwargs, connection.in_atomic_block))

    by_statement, by_ledger = NoOp3.start(), NoOp3.start()
    signals.workflow_transitioned.connect(receiver)
    try:
        (first,) = claim_due_steps(1, claimed_by="dispatcher-1")
        second = claim_step(scheduled_step(by_ledger).pk, claimed_by="dispatcher-1")
        with transaction.atomic():  # inside a caller's transaction, nothing is sent until it commits
            claimed_inside = NoOp3.start()
            claim_due_steps(1, claimed_by="dispatcher-1")
            assert [kwargs["workflow_id"] for _, kwargs, _ in sent] == [
                by_statement.record.workflow_id,
                by_ledger.record.workflow_id,
            ]
    finally:
        signals.workflow_transitioned.disconnect(receiver)

    assert first.run_id == by_statement.record.pk and first.run.status == "performing"
    assert claimed_rows(first.pk) == claimed_rows(second.pk)
    step, run, event = claimed_rows(first.pk)
    assert (step["status"], step["claimed_by"], step["stall_at"]) == (
        "in_progress",
        "dispatcher-1",
        settings.STALL_THRESHOLD,
    )
    assert (run["status"], run["status_changed_at"], run["paused_reason"]) == ("performing", timedelta(0), "")
    assert event["details"] == {"attempt": 1, "claimed_by": "dispatcher-1"} and event["created_at"] == timedelta(0)
    expected = {"transition": "claim", "from_status": "ready", "to_status": "performing", "actor": "system"}
    assert [(sender, kwargs, inside) for sender, kwargs, inside in sent] == [
        ("noop3", {**expected, "workflow_id": wf.record.workflow_id}, False)
        for wf in (by_statement, by_ledger, claimed_inside)
    ]


def test_nothing_later_and_no_job_is_said_plainly():
    steps, ahead = claim_and_look_ahead(4, claimed_by="d")
    assert steps == [] and ahead.next_due_at is None and not ahead.jobs_due


def test_a_due_step_the_claim_passed_over_is_not_due_later_so_the_loop_does_not_spin_on_it():
    wf = NoOp3.start()
    WorkflowRun.objects.filter(pk=wf.record.pk).update(workflow_class="only_newer_code_knows")

    steps, ahead = claim_and_look_ahead(4, claimed_by="d")

    assert steps == [] and ahead.next_due_at is None
    assert scheduled_step(wf).status == "scheduled"  # left for a dispatcher that knows it


def test_a_pending_job_due_now_is_seen_and_one_due_later_sets_the_next_look():
    wf = Squares.start(count=2)
    execute_step(claim_due_steps(1, claimed_by="d")[0])  # the fan-out: two pending jobs
    assert FanOutJob.objects.filter(step__run_id=wf.record.pk, status="pending").count() == 2

    steps, ahead = claim_and_look_ahead(4, claimed_by="d")
    assert steps == [] and ahead.jobs_due

    at = timezone.now() + timedelta(minutes=5)
    FanOutJob.objects.filter(step__run_id=wf.record.pk).update(scheduled_at=at)
    steps, ahead = claim_and_look_ahead(4, claimed_by="d")
    assert not ahead.jobs_due and ahead.next_due_at == at


def test_claims_only_look_at_the_queues_they_serve():
    NoOp3.start()
    later = NoOp3.start()
    at = timezone.now() + timedelta(seconds=30)
    WorkflowStep.objects.filter(run_id=later.record.pk).update(scheduled_at=at)

    steps, ahead = claim_and_look_ahead(4, queues=["elsewhere"], claimed_by="d")
    assert steps == [] and ahead.next_due_at is None  # neither the due step nor the later one
    steps, ahead = claim_and_look_ahead(4, queues=["workflows"], claimed_by="d")
    assert len(steps) == 1 and ahead.next_due_at == at


@pytest.fixture(params=["unprepared", "prepared"])
def preparing(request, monkeypatch):
    """Both ways a claim is sent: plain, and prepared on the server (as in a dispatcher on a direct connection)."""
    monkeypatch.setattr(sql, "_prepared_at", set())
    if request.param == "prepared":
        connection.ensure_connection()
        sql.prepare_statements(connection.connection)
    return request.param


def test_every_claim_of_a_long_series_gets_its_own_rows(preparing):
    # In a pipeline, a cursor that ran two statements may hand back the first one's rows (here
    # the flag's): the claim's statements each have a cursor of their own.
    NoOp3.start_many([{} for _ in range(500)])
    claimed = 0
    for limit in range(1, 31):
        steps, _ = claim_and_look_ahead(limit, claimed_by="d")
        assert len(steps) == limit
        assert all(s.status == "in_progress" and s.run.pk == s.run_id for s in steps)
        claimed += limit
    assert WorkflowStep.objects.filter(status="in_progress").count() == claimed == 465


def prepared_statements():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [text for (text,) in cursor.fetchall()]


def test_statements_are_prepared_only_on_the_server_said_to_allow_it(monkeypatch):
    monkeypatch.setattr(sql, "_prepared_at", set())
    connection.ensure_connection()
    NoOp3.start()
    NoOp3.start()
    claim_due_steps(1, claimed_by="d")
    assert prepared_statements() == []  # Django's default: nothing prepared

    sql._prepared_at.add(("another-host", 5432))
    claim_due_steps(1, claimed_by="d")
    assert prepared_statements() == []

    sql.prepare_statements(connection.connection)
    claim_due_steps(1, claimed_by="d")
    assert any("FOR UPDATE OF s SKIP LOCKED" in text for text in prepared_statements())


def heartbeats(observer, process, count):
    """Return once the dispatcher of ``process`` has written ``count`` more heartbeats, read on ``observer``."""
    read = f"SELECT heartbeat_at FROM {Dispatcher._meta.db_table} WHERE pid = %s"
    seen = set()

    def another():
        seen.add(observer.execute(read, [process.proc.pid]).fetchone()[0])
        return len(seen) > count  # the first seen, then ``count`` newer

    eventually(another, what=f"{count} heartbeats")


def transactions_committed():
    """Transactions committed in the test database so far, by every session (the statistics collector's count)."""
    with psycopg.connect(**_direct(), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [connection.settings_dict["NAME"]]
        ).fetchone()
    return row[0]


def _direct():
    s = connection.settings_dict
    return {"host": s["HOST"] or "127.0.0.1", "port": s["PORT"] or 5432, "user": s["USER"], "dbname": s["NAME"]}


@pytest.mark.processes
def test_a_dispatcher_waits_quietly_beside_a_due_step_it_cannot_run():
    wf = NoOp3.start()
    WorkflowRun.objects.filter(pk=wf.record.pk).update(workflow_class="only_newer_code_knows")
    # Polls an hour apart: the loop claims once, then only its heartbeat commits.
    process = DispatcherProcess("--no-sweep", settings={"POLL_INTERVAL": 3600, "HEARTBEAT_INTERVAL": 0.5})
    # Its heartbeats are watched in one transaction (each read sees the latest), one commit.
    with psycopg.connect(**_direct()) as observer:
        try:
            eventually(lambda: "started" in process.output(), what="the dispatcher started")
            heartbeats(observer, process, 2)  # its first round is over
            before = transactions_committed()
            heartbeats(observer, process, 4)
            committed = transactions_committed() - before
        finally:
            process.stop()
    # Four heartbeats and the statistics' lag are a few transactions; a loop spinning on the step, thousands.
    assert committed < 100, committed
    assert scheduled_step(wf).status == "scheduled"


def test_the_re_check_of_claims_is_prepared_where_claims_are(monkeypatch):
    """A worker re-checks most claims that waited in the shared queue: planned once per connection, not per call."""
    monkeypatch.setattr(sql, "_prepared_at", set())
    connection.ensure_connection()
    sql.prepare_statements(connection.connection)
    NoOp3.start()
    claimed = claim_due_steps(1, claimed_by="d")
    assert still_in_progress([claimed[0].pk]) == {claimed[0].pk}
    assert any(text.startswith("SELECT id FROM") and "= ANY($1)" in text for text in prepared_statements())
