"""Holds obeyed by real ``run_workflow_dispatcher`` processes: nothing held is claimed, nothing is lost."""

import pytest

from pgbus_workflows import hold_class, hold_queue, release_class, release_queue
from pgbus_workflows.models import Dispatcher, WorkflowRun, WorkflowStep
from tests.procs import eventually
from tests.testapp.held_workflows import FreeWork, HeldSignalled, HeldWork
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FAST = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 2, "POLL_INTERVAL": 0.2}


def _status(wf):
    return WorkflowRun.objects.get(pk=wf.record.pk).status


def _finished(cls, count):
    return lambda: WorkflowRun.objects.filter(workflow_class=cls.name, status="finished").count() == count


def test_two_dispatchers_claim_nothing_of_a_held_class_while_another_finishes_then_everything_after_release(
    dispatchers,
):
    dispatchers("--concurrency", "2", settings=FAST)
    dispatchers("--concurrency", "2", settings=FAST)
    eventually(lambda: Dispatcher.objects.count() == 2, what="both dispatchers to register")
    waiting = HeldSignalled.start()
    eventually(lambda: _status(waiting) == "waiting", what="the signalled run to wait for its signal")

    hold_class(HeldWork, actor="ops", reason="mail down")
    hold_class(HeldSignalled, actor="ops", reason="mail down")
    held = HeldWork.start_many([{} for _ in range(8)])
    started = HeldSignalled.start()  # a start during the hold is kept
    waiting.signal("go")  # and so is a signal
    FreeWork.start_many([{} for _ in range(8)])
    eventually(_finished(FreeWork, 8), timeout=60, what="the free class's runs to finish")
    # The free runs finished after the held ones were due: a claim would have taken them too.
    assert not SideEffect.objects.filter(label__startswith="held-").exists()
    assert set(WorkflowRun.objects.filter(pk__in=[w.record.pk for w in held]).values_list("status", flat=True)) == {
        "ready"
    }
    assert not WorkflowStep.objects.filter(run__workflow_class=HeldSignalled.name, status="in_progress").exists()

    release_class(HeldWork)
    release_class(HeldSignalled)
    eventually(_finished(HeldWork, 8), timeout=60, what="the held runs to finish after release")
    # The body's write commits before its outcome does: wait for the run, then count the writes.
    eventually(lambda: _status(waiting) == "finished", timeout=60, what="the signalled run to finish")
    assert SideEffect.objects.filter(label="held-go").count() == 1
    # Started during the hold, claimed after it: it waits for a signal of its own.
    eventually(lambda: _status(started) == "waiting", timeout=30, what="the run started during the hold to wait")
    assert SideEffect.objects.filter(label="held-first").count() == 8


def test_a_sigkilled_dispatcher_during_a_queue_hold_loses_nothing(dispatchers):
    victim = dispatchers("--concurrency", "2", settings=FAST)
    eventually(lambda: Dispatcher.objects.count() == 1, what="the dispatcher to register")
    hold_queue("held", actor="ops", reason="failover")
    held = HeldWork.start_many([{} for _ in range(6)])
    FreeWork.start()
    eventually(_finished(FreeWork, 1), timeout=60, what="the free run to finish")

    victim.kill()
    survivor = dispatchers("--concurrency", "2", settings=FAST)
    release_queue("held")

    eventually(_finished(HeldWork, 6), timeout=60, what=f"the held runs to finish: {survivor.output()[-2000:]}")
    assert SideEffect.objects.filter(label="held-first").count() == 6  # each body ran once
    assert not WorkflowStep.objects.filter(run__in=[w.record.pk for w in held], attempt__gt=1).exists()


def test_a_step_claimed_before_the_hold_runs_to_its_end_under_a_real_dispatcher(dispatchers):
    dispatchers("--concurrency", "2", settings=FAST)
    wf = HeldWork.start(seconds=1.5)
    eventually(lambda: _status(wf) == "performing", what="the first step to be claimed")
    hold_class(HeldWork, reason="stop new claims")

    eventually(lambda: SideEffect.objects.filter(label="held-first").exists(), timeout=30, what="the body to end")
    eventually(lambda: WorkflowRun.objects.get(pk=wf.record.pk).current_step == "second", what="the next step")
    FreeWork.start()  # a witness: claimed after the held run's next step was due
    eventually(_finished(FreeWork, 1), timeout=30, what="the free run to finish")
    assert _status(wf) == "ready"
    release_class(HeldWork)
    eventually(_finished(HeldWork, 1), timeout=30, what="the run to finish after release")
