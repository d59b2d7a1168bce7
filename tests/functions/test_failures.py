"""Durable functions' errors: pause by default, ``"raise"`` into the function, reattempts, determinism.

Each behaviour is its own ``@durable`` class; runs move with the test helpers, and the rows
(steps, events, side effects) are asserted.
"""

from datetime import timedelta

import pytest

from pgbus_workflows import NonDeterministicRun, OnException, StepFailed, durable
from pgbus_workflows.models import WorkflowEvent
from pgbus_workflows.services import operator
from pgbus_workflows.states import RunStatus, StepOutcomeKind
from tests.functions.bodies import FAILING, FlakyError, effect
from tests.support import labels, record, steps_of

pytestmark = pytest.mark.django_db


@durable(name="durable_charge", allow_multiple=True)
def charge(ctx):
    ctx.step("reserve", effect("reserve"))
    try:
        ctx.step("charge", effect("charge"), on_exception="raise")
    except StepFailed as failure:
        ctx.step("release", effect("release"))
        return {"failed": failure.step, "type": failure.exception_type, "message": failure.message}
    return {"charged": True}


@durable(name="durable_pausing", allow_multiple=True)
def pausing(ctx):
    ctx.step("first", effect("first"))
    ctx.step("second", effect("second"))
    return "done"


@durable(name="durable_retrying", allow_multiple=True)
def retrying(ctx):
    policy = OnException(FlakyError, action="reattempt", wait=timedelta(minutes=1), max_reattempts=2)
    return ctx.step("call", effect("call"), on_exception=policy)


@durable(name="durable_raising", allow_multiple=True)
def raising(ctx):
    ctx.step("before", effect("before"))
    if "outside" in FAILING:
        raise FlakyError("the function itself failed")
    return "done"


@durable(name="durable_changing", allow_multiple=True)
def changing(ctx):
    ctx.step("first", effect("first"))
    ctx.step("renamed" if "renamed" in FAILING else "second", effect("second"))
    return "done"


@durable(name="durable_swallowing", allow_multiple=True)
def swallowing(ctx):
    try:
        ctx.step("first", effect("first"))
        ctx.step("second", effect("second"))
    except Exception:  # user code that swallows everything cannot swallow the engine's stop
        record("swallowed")
    return "done"


def test_raise_records_the_failure_and_the_function_compensates(helpers):
    FAILING.add("charge")
    run = charge.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"failed": "charge", "type": "tests.functions.bodies.FlakyError", "message": "charge failed"}
    assert labels() == ["reserve", "charge", "release"]
    failed = next(s for s in steps_of(run) if s.step_name == "charge")
    assert failed.outcome == StepOutcomeKind.FAILED
    assert failed.error_message == "charge failed"


def test_a_failing_checkpoint_pauses_by_default_and_resume_runs_it_again(helpers):
    FAILING.add("second")
    run = pausing.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    assert run.current_step == "second"
    FAILING.clear()
    operator.resume(run.record.pk)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == "done"
    assert labels() == ["first", "second", "second"]  # first replayed, not called again


def test_a_reattempt_policy_waits_its_backoff_then_runs_the_checkpoint_again(helpers):
    FAILING.add("call")
    run = retrying.start(None)
    helpers.perform_next_step(run)
    call = [s for s in steps_of(run) if s.step_name == "call"]
    assert [s.outcome for s in call] == [StepOutcomeKind.REATTEMPTED, ""]
    assert call[1].scheduled_at - call[0].finished_at == timedelta(minutes=1)
    FAILING.clear()
    helpers.advance(timedelta(minutes=5))
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == "call"
    assert [s.attempt for s in steps_of(run) if s.step_name == "call"] == [1, 2]


def test_an_exception_outside_any_checkpoint_pauses_the_run(helpers):
    FAILING.add("outside")
    run = raising.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    assert "the function itself failed" in run.record.paused_reason
    FAILING.clear()
    operator.resume(run.record.pk)
    helpers.speedrun_workflow(run)
    assert run.result() == "done"
    assert labels() == ["before"]


def test_a_replay_meeting_another_name_pauses_with_non_deterministic_run(helpers):
    FAILING.add("second")
    run = changing.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    FAILING.clear()
    FAILING.add("renamed")  # the code changed under the paused run
    operator.resume(run.record.pk)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    assert NonDeterministicRun.__name__ in run.record.paused_reason
    assert "'renamed'" in run.record.paused_reason
    assert "'second'" in run.record.paused_reason


def test_except_exception_in_the_function_cannot_swallow_a_pause(helpers):
    FAILING.add("second")
    run = swallowing.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    assert "swallowed" not in labels()
    assert WorkflowEvent.objects.filter(run=run.record, kind="step_failed").exists()
