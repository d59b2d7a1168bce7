"""Durable functions that park: ``ctx.sleep`` and ``ctx.wait_for`` hold no attempt until they are due.

The virtual clock (``helpers.advance``) makes a sleep or a wait's timeout due; signals are sent
before and after the wait; everything is asserted on the rows.
"""

from datetime import timedelta

import pytest

from pgbus_workflows import durable
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.states import RunStatus, StepStatus
from tests.support import labels, record, steps_of

pytestmark = pytest.mark.django_db


def effect(label):
    """A checkpoint body: records ``label`` in the side effects table and returns it."""

    def body():
        record(label)
        return label

    return body


@durable(name="durable_sleeper", allow_multiple=True)
def sleeper(ctx):
    ctx.step("before", effect("before"))
    ctx.sleep("cool_down", timedelta(hours=1))
    return ctx.step("after", effect("after"))


@durable(name="durable_payment", allow_multiple=True)
def payment(ctx):
    ctx.step("invoice", effect("invoice"))
    paid = ctx.wait_for("payment", timeout=timedelta(days=2))
    return {"paid": paid}


def in_flight(run):
    return WorkflowStep.objects.filter(run_id=run.record.pk, status=StepStatus.IN_PROGRESS).count()


def test_sleep_parks_with_no_attempt_in_flight_until_the_clock_makes_it_due(helpers):
    run = sleeper.start(None)
    helpers.perform_next_step(run)
    assert run.reload().status == RunStatus.READY
    assert in_flight(run) == 0
    parked = WorkflowStep.objects.get(run_id=run.record.pk, status=StepStatus.SCHEDULED)
    assert parked.step_name == "cool_down"
    helpers.advance(timedelta(minutes=59))
    assert run.reload().status == RunStatus.READY
    helpers.advance(timedelta(minutes=2))
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == "after"
    assert labels() == ["before", "after"]  # "before" was replayed, not called again


def test_a_signal_sent_after_the_wait_wakes_the_function_with_its_payload(helpers):
    run = payment.start(None)
    helpers.perform_next_step(run)
    assert run.reload().status == RunStatus.WAITING
    assert in_flight(run) == 0
    helpers.deliver_signal(run, "payment", {"amount": 10})
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"paid": {"amount": 10}}
    assert labels() == ["invoice"]


def test_a_signal_sent_before_the_wait_is_kept(helpers):
    run = payment.start(None)
    run.signal("payment", {"amount": 5})
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"paid": {"amount": 5}}
    waited = next(s for s in steps_of(run) if s.step_name == "payment")
    assert waited.status == StepStatus.COMPLETED
    assert waited.signal.payload == {"amount": 5}


def test_the_wait_gives_none_at_its_timeout(helpers):
    run = payment.start(None)
    helpers.perform_next_step(run)
    helpers.advance(timedelta(days=2, minutes=1))
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"paid": None}


def test_expire_wait_times_the_wait_out_at_once(helpers):
    run = payment.start(None)
    helpers.perform_next_step(run)
    helpers.expire_wait(run)
    helpers.speedrun_workflow(run)
    assert run.result() == {"paid": None}
