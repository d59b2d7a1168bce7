"""The sweep phases, run in-process: retention, stalls, the gauge, one sweeper at a time."""

from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from pgbus_workflows import signals
from pgbus_workflows.checks import check_settings
from pgbus_workflows.dispatcher.sweep import SWEEP_LOCK_KEY, Sweeper
from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.retention import delete_expired_runs
from pgbus_workflows.services.stuck import gauge
from tests.procs import eventually
from tests.testapp.workflows import Counted

pytestmark = pytest.mark.django_db(transaction=True)


def finish(wf):
    while wf.reload().status == "ready":
        for step in claim_due_steps(1, claimed_by="test"):
            execute_step(step)
    return wf


def age(wf, days):
    WorkflowRun.objects.filter(pk=wf.record.pk).update(status_changed_at=timezone.now() - timedelta(days=days))


def test_retention_deletes_old_finished_and_cancelled_runs_with_their_rows_and_keeps_the_rest():
    old_finished = finish(Counted.start())
    old_cancelled = Counted.start().cancel(reason="test")
    recent = finish(Counted.start())
    old_ongoing = Counted.start()
    for wf in (old_finished, old_cancelled, old_ongoing):
        age(wf, 31)

    deleted = delete_expired_runs(timezone.now(), batch_size=1)

    assert deleted == 2
    remaining = set(WorkflowRun.objects.values_list("workflow_id", flat=True))
    assert remaining == {recent.workflow_id, old_ongoing.workflow_id}
    assert not WorkflowStep.objects.filter(run__workflow_id=old_finished.workflow_id).exists()
    assert not WorkflowEvent.objects.exclude(run__workflow_id__in=remaining).exists()


@override_settings(PGBUS_WORKFLOWS={"RETENTION": None})
def test_retention_none_keeps_everything():
    wf = finish(Counted.start())
    age(wf, 3650)

    assert delete_expired_runs(timezone.now()) == 0
    assert WorkflowRun.objects.filter(pk=wf.record.pk).exists()


def test_cleanup_runs_hourly_not_every_sweep():
    sweeper = Sweeper()
    now = timezone.now()
    assert "cleanup" in sweeper.run(now)
    assert "cleanup" not in sweeper.run(now + timedelta(minutes=5))
    assert "cleanup" in sweeper.run(now + timedelta(minutes=61))


def test_gauge_counts_statuses_and_stuck_reasons_zero_filled_over_registered_classes():
    received = []

    def receiver(sender, **kwargs):
        received.append(kwargs)

    finish(Counted.start())
    stalled = Counted.start()
    claim_due_steps(1, claimed_by="gone")
    WorkflowStep.objects.filter(run=stalled.record).update(stall_at=timezone.now() - timedelta(seconds=1))
    signals.workflow_gauge.connect(receiver)
    try:
        Sweeper().run()
    finally:
        signals.workflow_gauge.disconnect(receiver)

    payload = received[0]
    counted = {(r["status"], r["count"]) for r in payload["statuses"] if r["workflow_class"] == "counted"}
    assert ("finished", 1) in counted and ("paused", 0) in counted
    # The sweep stalled the step (STALL_ACTION reattempt), so nothing is stuck once it ran.
    assert WorkflowStep.objects.get(run=stalled.record, attempt=1).outcome == "stalled"
    classes = {r["workflow_class"] for r in payload["stuck"]}
    assert {"counted", "three_steps", "slow"} <= classes
    reasons = {"stalled", "overdue", "waiting_overdue", "paused_on_error", "fan_out_unresolved"}
    assert {r["reason"] for r in payload["stuck"]} == reasons


def test_gauge_reports_each_stuck_reason():
    now = timezone.now()
    stalled = Counted.start()
    claim_due_steps(1, claimed_by="gone")
    WorkflowStep.objects.filter(run=stalled.record).update(stall_at=now - timedelta(seconds=1))
    overdue = Counted.start()
    WorkflowStep.objects.filter(run=overdue.record).update(scheduled_at=now - timedelta(hours=2))
    paused = Counted.start()
    WorkflowStep.objects.filter(run=paused.record).update(status="failed", outcome="failed")
    WorkflowRun.objects.filter(pk=paused.record.pk).update(status="paused")

    stuck = {(r["workflow_class"], r["reason"]): r["count"] for r in gauge(now)["stuck"]}

    assert stuck[("counted", "stalled")] == 1
    assert stuck[("counted", "overdue")] == 1
    assert stuck[("counted", "paused_on_error")] == 1
    assert stuck[("counted", "waiting_overdue")] == 0


def test_only_one_dispatcher_sweeps_at_a_time():
    s = connection.settings_dict
    with psycopg.connect(
        dbname=s["NAME"], user=s["USER"], host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, autocommit=True
    ) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [SWEEP_LOCK_KEY])
        assert Sweeper().run() is None
        other.execute("SELECT pg_advisory_unlock(%s)", [SWEEP_LOCK_KEY])
    assert Sweeper().run() is not None


@override_settings(PGBUS_WORKFLOWS={"DISPATCHER_DEAD_AFTER": 60, "STALL_ACTION": "pause"})
def test_a_dead_dispatchers_steps_get_the_stall_action_at_once():
    wf = Counted.start()
    Dispatcher.objects.create(name="dead", hostname="h", pid=1, heartbeat_at=timezone.now() - timedelta(minutes=5))
    Dispatcher.objects.create(name="alive", hostname="h", pid=2)
    claim_due_steps(1, claimed_by="dead")

    summary = Sweeper().run()

    assert summary["dead_dispatchers"] == 1
    assert wf.reload().status == "paused"
    step = WorkflowStep.objects.get(run=wf.record)
    assert (step.status, step.outcome, step.error_class) == (
        "failed",
        "stalled",
        "pgbus_workflows.exceptions.StepStalled",
    )
    assert set(Dispatcher.objects.values_list("name", flat=True)) == {"alive"}


@override_settings(PGBUS_WORKFLOWS={"STALL_ACTION": "cancel"})
def test_stall_action_cancel():
    wf = Counted.start()
    claim_due_steps(1, claimed_by="x")
    WorkflowStep.objects.filter(run=wf.record).update(stall_at=timezone.now() - timedelta(seconds=1))

    Sweeper().run()

    assert wf.reload().status == "cancelled"
    assert WorkflowEvent.objects.get(run=wf.record, kind="step_stalled").details["action"] == "cancel"


def stall_once(wf):
    """Claim the run's due step, let its (tiny) stall threshold pass, and sweep."""
    (claimed,) = claim_due_steps(1, claimed_by="crashes-every-time")
    assert claimed.run_id == wf.record.pk
    eventually(
        lambda: WorkflowStep.objects.filter(pk=claimed.pk, stall_at__lt=Now()).exists(), what="the stall threshold"
    )
    Sweeper().run()


@override_settings(PGBUS_WORKFLOWS={"STALL_THRESHOLD": 0.05, "MAX_STALLS": 2})
def test_a_step_that_stalls_after_max_stalls_in_a_row_pauses_the_run_instead_of_looping():
    wf = Counted.start()
    stall_once(wf)
    stall_once(wf)
    assert wf.reload().status == "ready"  # two stalls: reattempted each time

    stall_once(wf)

    assert wf.reload().status == "paused"
    assert "3 stalled attempts in a row" in wf.record.paused_reason
    last = WorkflowEvent.objects.filter(run=wf.record, kind="step_stalled").order_by("pk").last()
    assert (last.details["action"], last.details["stalls_exhausted"]) == ("pause", 2)
    attempts = WorkflowStep.objects.filter(run=wf.record).order_by("pk")
    assert [(a.attempt, a.outcome, a.reattempt_reason) for a in attempts] == [
        (1, "stalled", "stall"),
        (2, "stalled", "stall"),
        (3, "stalled", ""),
    ]

    wf.resume(actor="ops", reason="fixed the crash")
    stall_once(wf)

    assert wf.reload().status == "ready", "a resumed run starts a new count"
    assert WorkflowStep.objects.filter(run=wf.record, outcome="stalled").count() == 4


@override_settings(PGBUS_WORKFLOWS={"STALL_THRESHOLD": 0.05, "MAX_STALLS": None})
def test_max_stalls_none_reattempts_for_ever():
    wf = Counted.start()
    for _ in range(4):
        stall_once(wf)
    assert wf.reload().status == "ready"
    assert WorkflowStep.objects.filter(run=wf.record, outcome="stalled", reattempt_reason="stall").count() == 4


@pytest.mark.parametrize("value", [-1, "5", True, 2.5])
def test_max_stalls_must_be_a_count_or_none(value):
    with override_settings(PGBUS_WORKFLOWS={"MAX_STALLS": value}):
        errors = check_settings()
    assert [e.id for e in errors] == ["pgbus_workflows.E009"]
    assert "MAX_STALLS" in errors[0].msg


@pytest.mark.parametrize("value", [None, 0, 7])
def test_max_stalls_accepts_none_and_counts(value):
    with override_settings(PGBUS_WORKFLOWS={"MAX_STALLS": value}):
        assert check_settings() == []
