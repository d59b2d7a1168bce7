"""A durable wait whose attempt is lost (its dispatcher killed) after a signal or its timeout woke it.

The signal (or the timeout) belongs to the checkpoint, not to the lost attempt: the sweep's
reattempt carries it, and the function goes on with it instead of waiting again for ever.
The same state follows a kill between ``ctx.wait_for`` taking a signal sent earlier and
recording it: an attempt in progress that holds the signal.
"""

from datetime import timedelta

import pytest

from pgbus_workflows import durable
from pgbus_workflows.dispatcher.sweep import stall_overdue_steps
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.sql import clock
from pgbus_workflows.states import RunStatus, StepStatus

pytestmark = pytest.mark.django_db


@durable(name="durable_lost_wait", allow_multiple=True)
def lost_wait(ctx):
    paid = ctx.wait_for("payment", timeout=timedelta(days=2))
    return {"paid": paid}


def lose_the_attempt_in_flight(run):
    """A dispatcher claims the woken wait and dies: the sweep stalls its attempt and schedules another."""
    (claimed,) = claim_due_steps(1, claimed_by="gone")
    assert claimed.run_id == run.record.pk and claimed.step_name == "payment"
    WorkflowStep.objects.filter(pk=claimed.pk).update(stall_at=clock.now() - timedelta(seconds=1))
    assert stall_overdue_steps(clock.now()) == 1
    assert WorkflowStep.objects.get(pk=claimed.pk).status == StepStatus.FAILED  # stalled


def test_the_reattempt_of_a_wait_a_signal_woke_carries_the_signal(helpers):
    run = lost_wait.start(None)
    helpers.perform_next_step(run)
    assert run.reload().status == RunStatus.WAITING
    run.signal("payment", {"amount": 7})

    lose_the_attempt_in_flight(run)
    helpers.speedrun_workflow(run)

    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"paid": {"amount": 7}}


def test_the_reattempt_of_a_wait_that_timed_out_carries_the_timeout(helpers):
    run = lost_wait.start(None)
    helpers.perform_next_step(run)
    helpers.expire_wait(run)

    lose_the_attempt_in_flight(run)
    helpers.speedrun_workflow(run)

    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"paid": None}
