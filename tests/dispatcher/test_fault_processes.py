"""Faults that live in the dispatcher process, with real ``run_workflow_dispatcher`` processes.

A worker whose body raises SystemExit, outcomes the database refuses, an atomic body holding
its run's lock while the sweep passes, a sweep stuck in a slow receiver while claims and
heartbeats go on, and dispatchers whose host clock is a minute off (Debian's ``faketime``).
"""

import os
import signal
from collections import Counter

import pytest

from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowRun, WorkflowStep
from tests.procs import LIBFAKETIME, eventually, skewed_clock
from tests.testapp import fault_workflows as faults
from tests.testapp.models import Receipt, SideEffect
from tests.testapp.workflows import Counted

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FAST = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 2, "POLL_INTERVAL": 0.2}


def settled(runs):
    """All runs are finished or paused (nothing left to run)."""
    return lambda: all(wf.reload().status in ("finished", "paused") for wf in runs)


def no_engine_recovery():
    """No attempt was stalled, orphaned or had its outcome discarded: every body's outcome was written."""
    kinds = set(WorkflowEvent.objects.values_list("kind", flat=True))
    assert not kinds & {"step_stalled", "outcome_discarded"}, kinds
    assert not WorkflowStep.objects.filter(outcome="stalled").exists()


def test_a_body_raising_system_exit_leaves_a_one_worker_dispatcher_serving_and_stopping_promptly(dispatchers):
    exits = [faults.RaisesBaseException.start(kind=kind) for kind in ("SystemExit", "KeyboardInterrupt")]
    counted = [Counted.start() for _ in range(5)]
    process = dispatchers("--concurrency", "1", settings=FAST)

    eventually(settled(exits + counted), what="every run to settle")

    assert [wf.reload().status for wf in exits] == ["paused", "paused"]
    assert all(wf.reload().status == "finished" for wf in counted), process.output()
    assert SideEffect.objects.filter(label="base-exception").count() == 2  # once each
    assert eventually(lambda: Dispatcher.objects.filter(workers_alive=1).exists(), what="one live worker")
    no_engine_recovery()
    process.send(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert "Waiting up to" not in process.output(), "a dead claim held the shutdown"


def test_outcomes_the_database_refuses_are_recorded_once_through_a_real_dispatcher(dispatchers):
    runs = [
        faults.NulOutput.start(),
        faults.NulError.start(),
        faults.BrokenWait.start(),
        faults.HugeReattemptWait.start(),
        faults.SwallowsDatabaseError.start(),
        faults.NulJobResult.start(),
        faults.BrokenBackoff.start(),
        faults.JobRaisesSystemExit.start(),
    ]
    process = dispatchers("--concurrency", "2", settings=FAST)

    eventually(settled(runs), what="every faulty run to settle")

    runs_of = Counter(SideEffect.objects.values_list("label", "key"))
    assert runs_of and set(runs_of.values()) == {1}, f"a body ran twice: {runs_of}"
    for wf in runs:
        attempts = WorkflowStep.objects.filter(run=wf.record).count()
        assert attempts == 1, f"{wf.name}: {attempts} attempts"
    assert "could not be finished" not in process.output()
    no_engine_recovery()


def test_an_atomic_body_holding_its_lock_does_not_hold_up_the_sweep(dispatchers):
    holder = faults.HoldsLock.start(seconds=5)
    waiting = faults.TimesOut.start()
    worker = dispatchers("--concurrency", "2", "--no-sweep", settings=FAST)
    sweeper = dispatchers("--sweep-only", settings=FAST)

    eventually(lambda: WorkflowEvent.objects.filter(run=waiting.record, kind="wait_timed_out").exists(), 20)

    assert Receipt.objects.count() == 0, "the atomic body had already committed: nothing was held"
    eventually(lambda: holder.reload().status == "finished", what="the atomic body to finish")
    timed_out = WorkflowEvent.objects.get(run=waiting.record, kind="wait_timed_out")
    hold = WorkflowStep.objects.get(run=holder.record, step_name="hold")
    assert timed_out.created_at < hold.finished_at
    assert Dispatcher.objects.count() == 2, "a dispatcher was taken for dead meanwhile"
    no_engine_recovery()
    for process in (worker, sweeper):
        process.send(signal.SIGTERM)
        assert process.wait() == 0


def test_a_hung_atomic_body_is_stalled_at_its_timeout_and_run_again(dispatchers):
    wf = faults.HungAtomic.start(seconds=4)
    dispatchers("--concurrency", "2", settings={**FAST, "STALL_ACTION": "reattempt"})

    eventually(lambda: wf.reload().status == "finished", what="the run to finish after the stall")

    first, second = WorkflowStep.objects.filter(run=wf.record, step_name="hang").order_by("attempt")
    assert first.outcome == "stalled" and second.status == "completed"
    assert list(Receipt.objects.values_list("note", flat=True)) == ["hung 2"]


def test_a_sweep_stuck_in_a_slow_receiver_delays_neither_claims_nor_heartbeats(dispatchers):
    process = dispatchers("--concurrency", "2", settings=FAST, env={"TESTAPP_SLOW_GAUGE": "6"})
    eventually(lambda: SideEffect.objects.filter(label="gauge-start").exists(), what="the sweep to be stuck")
    beat = Dispatcher.objects.get().heartbeat_at
    runs = [Counted.start() for _ in range(3)]

    eventually(lambda: all(wf.reload().status == "finished" for wf in runs), what="runs started mid-sweep")

    assert not SideEffect.objects.filter(label="gauge-end").exists(), "the claims waited for the sweep"
    eventually(lambda: Dispatcher.objects.get().heartbeat_at > beat, what="a heartbeat during the sweep")
    assert not SideEffect.objects.filter(label="gauge-end").exists()
    process.send(signal.SIGTERM)
    assert process.wait(timeout=20) == 0


@pytest.mark.skipif(
    LIBFAKETIME is None and not os.environ.get("CI"),  # CI installs it: there, its absence fails
    reason="needs Debian's faketime (apt-get install faketime; .ci/run does)",
)
def test_dispatchers_whose_clocks_are_a_minute_off_stall_nothing_alive_and_cut_no_wait_short(dispatchers):
    settings = {**FAST, "STALL_THRESHOLD": 20}
    slow = [faults.SlowBody.start(seconds=3) for _ in range(2)]
    behind = dispatchers("--concurrency", "2", "--no-sweep", settings=settings, env=skewed_clock("-60s"))
    eventually(
        lambda: SideEffect.objects.filter(label="slow-body").count() == 2, what="the slow bodies to start behind"
    )
    ahead = dispatchers("--concurrency", "2", settings=settings, env=skewed_clock("+60s"))
    waits = faults.WaitsBetween.start()

    eventually(lambda: all(wf.reload().status == "finished" for wf in [*slow, waits]), 30, what="every run")

    assert SideEffect.objects.filter(label="slow-body").count() == 2, "a live body was stalled and run again"
    no_engine_recovery()
    first = WorkflowStep.objects.get(run=waits.record, step_name="first")
    second = WorkflowStep.objects.get(run=waits.record, step_name="second")
    assert (second.started_at - first.finished_at).total_seconds() >= 3, "the wait was cut short"
    assert Dispatcher.objects.count() == 2, "a dispatcher was taken for dead"
    assert not WorkflowRun.objects.exclude(status="finished").exists()
    for process in (behind, ahead):
        process.send(signal.SIGTERM)
        assert process.wait() == 0
