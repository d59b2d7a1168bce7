"""``"raise"`` once the policy gives up: reattempts first, then ``StepFailed`` into the function, on every replay.

Each behaviour is its own ``@durable`` class; runs move with the test helpers, and the rows
(steps, events, side effects) are asserted.
"""

from datetime import timedelta

import pytest

from pgbus_workflows import ConfigurationError, OnException, StepFailed, Workflow, durable, step
from pgbus_workflows.services import operator
from pgbus_workflows.states import RunStatus, StepOutcomeKind
from tests.functions.bodies import FAILING, FlakyError, effect
from tests.support import events_of, labels, record, steps_of

pytestmark = pytest.mark.django_db


@durable(name="durable_raise_after", allow_multiple=True)
def raise_after(ctx):
    try:
        ctx.step("call", effect("call"), on_exception="raise", max_reattempts=2)
    except StepFailed as failure:
        ctx.step("compensate", effect("compensate"))
        ctx.step("last", effect("last"))
        return {"failed": failure.step, "message": failure.message}
    return "called"


def test_raise_with_max_reattempts_reattempts_then_raises_into_the_function_on_every_replay(helpers):
    FAILING.update({"call", "last"})
    run = raise_after.start(None)
    helpers.speedrun_workflow(run)
    call = [s for s in steps_of(run) if s.step_name == "call"]
    assert [s.attempt for s in call] == [1, 2, 3]
    assert [s.outcome for s in call] == [StepOutcomeKind.REATTEMPTED] * 2 + [StepOutcomeKind.FAILED]
    assert run.reload().status == RunStatus.PAUSED  # at "last", which fails by default
    assert run.current_step == "last"
    (raised,) = [e for e in events_of(run, "step_failed") if e.details.get("action") == "raise"]
    assert raised.details["error_message"] == "call failed"
    FAILING.clear()
    operator.resume(run.record.pk)
    helpers.speedrun_workflow(run)  # the replay raises StepFailed again, without calling "call"
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"failed": "call", "message": "call failed"}
    assert labels() == ["call", "call", "call", "compensate", "last", "last"]


@durable(name="durable_raise_terminal", allow_multiple=True)
def raise_terminal(ctx):
    policy = OnException(
        FlakyError, action="reattempt", wait=timedelta(minutes=1), max_reattempts=1, terminal_action="raise"
    )
    try:
        return ctx.step("call", effect("call"), on_exception=policy)
    except StepFailed as failure:
        return {"failed": failure.step}


def test_a_reattempt_policy_with_terminal_action_raise_waits_its_backoff_then_raises(helpers):
    FAILING.add("call")
    run = raise_terminal.start(None)
    helpers.perform_next_step(run)
    call = [s for s in steps_of(run) if s.step_name == "call"]
    assert call[1].scheduled_at - call[0].finished_at == timedelta(minutes=1)
    helpers.advance(timedelta(minutes=2))
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"failed": "call"}
    assert labels() == ["call", "call"]


@durable(
    name="durable_raise_by_class",
    allow_multiple=True,
    exception_policies=[OnException(FlakyError, action="raise")],
)
def raise_by_class(ctx):
    try:
        return ctx.step("call", effect("call"))
    except StepFailed as failure:
        return {"failed": failure.step, "type": failure.exception_type}


def test_the_class_policy_may_raise_into_the_function(helpers):
    FAILING.add("call")
    run = raise_by_class.start(None)
    helpers.speedrun_workflow(run)
    assert run.result() == {"failed": "call", "type": "tests.functions.bodies.FlakyError"}


@durable(name="durable_raise_other_error", allow_multiple=True)
def raise_other_error(ctx):
    def broken():
        record("broken")
        raise KeyError("not the policy's")

    try:
        return ctx.step("call", broken, on_exception=OnException(FlakyError, action="raise"))
    except StepFailed:
        return "raised"


def test_the_checkpoints_own_policy_applies_to_every_error_as_a_steps_does(helpers):
    run = raise_other_error.start(None)
    helpers.speedrun_workflow(run)
    assert run.result() == "raised"  # a step's own on_exception is its policy for any error


def test_a_step_class_refuses_raise():
    with pytest.raises(ConfigurationError, match="durable function"):

        class Raising(Workflow):
            name = "raising_steps"
            exception_policies = [OnException(FlakyError, action="raise")]

            @step
            def only(self):
                return 1

    with pytest.raises(ConfigurationError, match="durable function"):

        class RaisingStep(Workflow):
            name = "raising_step"

            @step(on_exception=OnException(action="reattempt", max_reattempts=2, terminal_action="raise"))
            def only(self):
                return 1
