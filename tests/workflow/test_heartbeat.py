"""``self.heartbeat()``: a body that is long on purpose is not taken for hung by the sweep.

The body runs in a real thread while the main thread runs the real sweep every 100 ms, with
a stall threshold shorter than the body.
"""

import asyncio
import time

import pytest
from django.test import override_settings

from pgbus_workflows import NotInStep, Workflow, step
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.models import WorkflowEvent, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from tests.testapp.models import SideEffect
from tests.testapp.workflows import record
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)

#: Shorter than every body below: without heartbeats each would be stalled.
SHORT = {"STALL_THRESHOLD": 0.6}


class Beats(Workflow):
    """A body of ``beats`` pauses of ``every`` seconds, each followed by a heartbeat (if asked)."""

    name = "heartbeat_beats"

    @step
    def long(self):
        for _ in range(self.arguments["beats"]):
            time.sleep(self.arguments["every"])
            if self.arguments["heartbeat"]:
                record("beat", str(self.heartbeat()))
        return {"beats": self.arguments["beats"]}

    @step
    def after(self):
        pass


class AsyncBeats(Workflow):
    """The same body, ``async def``: it awaits its pauses and its heartbeats."""

    name = "heartbeat_async_beats"

    @step
    async def long(self):
        for _ in range(self.arguments["beats"]):
            await asyncio.sleep(self.arguments["every"])
            if self.arguments["heartbeat"]:
                alive = await self.aheartbeat()
                await SideEffect.objects.acreate(label="beat", key=str(alive))
        return {"beats": self.arguments["beats"]}

    @step
    def after(self):
        pass


class AsyncBeatsPastTimeout(Workflow):
    """Five 0.3 s awaits against a 0.6 s ``timeout=``, which cancels the coroutine unless it heartbeats."""

    name = "heartbeat_async_past_timeout"

    @step(timeout=0.6)
    async def long(self):
        for _ in range(5):
            await asyncio.sleep(0.3)
            if self.arguments["heartbeat"]:
                await self.aheartbeat()
        return "done"


def run_while_sweeping(wf, during=None):
    """Execute the run's first step in a thread, sweeping every 100 ms until it ends."""
    (claimed,) = claim_due_steps(1, claimed_by="worker")
    worker = Worker(execute_step, claimed)
    worker.start()
    sweeper = Sweeper()
    while worker.is_alive():
        sweeper.run()
        if during is not None:
            during()
        time.sleep(0.1)
    return worker.finish()


@pytest.mark.parametrize("cls", [Beats, AsyncBeats], ids=["plain", "async"])
@override_settings(PGBUS_WORKFLOWS=SHORT)
def test_a_body_that_heartbeats_outlives_the_stall_threshold(cls):
    wf = cls.start(beats=5, every=0.3, heartbeat=True)

    outcome = run_while_sweeping(wf)

    assert outcome.kind == "success"
    attempts = list(WorkflowStep.objects.filter(run=wf.record, step_name="long"))
    assert [(a.attempt, a.status, a.outcome) for a in attempts] == [(1, "completed", "success")]
    assert list(SideEffect.objects.values_list("key", flat=True)) == ["True"] * 5
    assert not WorkflowEvent.objects.filter(run=wf.record, kind="step_stalled").exists()
    assert wf.reload().current_step == "after"


@pytest.mark.parametrize("cls", [Beats, AsyncBeats], ids=["plain", "async"])
@override_settings(PGBUS_WORKFLOWS=SHORT)
def test_without_heartbeats_the_same_body_is_stalled_and_its_outcome_discarded(cls):
    # 2.4 s of body against a 0.6 s threshold: a sweep stalls it even on a loaded machine.
    wf = cls.start(beats=8, every=0.3, heartbeat=False)

    run_while_sweeping(wf)

    first = WorkflowStep.objects.get(run=wf.record, step_name="long", attempt=1)
    assert (first.status, first.outcome) == ("failed", "stalled")
    assert WorkflowEvent.objects.filter(run=wf.record, kind="step_stalled").count() == 1
    assert WorkflowEvent.objects.filter(run=wf.record, kind="outcome_discarded").count() == 1
    assert WorkflowStep.objects.get(run=wf.record, step_name="long", attempt=2).status == "scheduled"


@override_settings(PGBUS_WORKFLOWS=SHORT)
def test_heartbeat_says_false_once_the_attempt_was_cancelled():
    # Ten beats: however loaded the machine, the cancel lands while the body still beats.
    wf = Beats.start(beats=10, every=0.2, heartbeat=True)

    def cancel_after_the_first_beat():
        if SideEffect.objects.exists() and wf.reload().status != "cancelled":
            wf.cancel(reason="operator")

    run_while_sweeping(wf, during=cancel_after_the_first_beat)

    beats = list(SideEffect.objects.order_by("pk").values_list("key", flat=True))
    assert beats[0] == "True" and beats[-1] == "False"
    step_row = WorkflowStep.objects.get(run=wf.record, step_name="long")
    assert step_row.status == "cancelled"  # the heartbeat wrote nothing to a cancelled attempt


def test_heartbeat_outside_a_body_raises_not_in_step():
    wf = Beats.start(beats=1, every=0, heartbeat=True)
    with pytest.raises(NotInStep, match="heartbeat"):
        wf.heartbeat()


@pytest.mark.parametrize("heartbeat", [True, False])
def test_an_async_body_s_heartbeat_moves_the_timeout_that_cancels_it(heartbeat):
    wf = AsyncBeatsPastTimeout.start(heartbeat=heartbeat)
    (claimed,) = claim_due_steps(1, claimed_by="worker")

    outcome = execute_step(claimed)

    if heartbeat:
        assert (outcome.kind, wf.reload().status) == ("success", "finished")
    else:
        assert outcome.kind == "stall"
        assert WorkflowEvent.objects.get(run=wf.record, kind="step_stalled").details["detection"] == "timeout"
