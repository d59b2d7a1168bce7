"""``resume_at(checkpoint)`` rewinds a paused durable run: it and every later checkpoint run again.

The earlier attempts stay in the history, superseded; the rows, events and side effects are asserted.
"""

import pytest

from pgbus_workflows import StepNotDefined, durable
from pgbus_workflows.services import operator
from pgbus_workflows.states import RunStatus, StepOutcomeKind, StepStatus
from tests.functions.bodies import FAILING
from tests.functions.bodies import effect as plain_effect
from tests.support import VIEW, events_of, labels, operation_url, staff_user, steps_of

pytestmark = pytest.mark.django_db


def effect(label):
    """A checkpoint body that returns its label and how many bodies had run (``bodies.effect``)."""
    return plain_effect(label, counted=True)


@durable(name="durable_rewound", allow_multiple=True)
def rewound(ctx):
    return [ctx.step("a", effect("a")), ctx.step("b", effect("b")), ctx.step("c", effect("c"))]


def test_resume_at_an_earlier_checkpoint_runs_it_and_every_later_one_again(helpers):
    FAILING.add("c")
    run = rewound.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    FAILING.clear()
    operator.resume_at(run.record.pk, "b")
    (event,) = events_of(run, "resumed_at")
    assert event.details == {"step": "b", "superseded": ["c"]}
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert labels() == ["a", "b", "c", "b", "c"]  # "a" replayed; "b" and "c" ran again
    assert run.result() == ["a 1", "b 4", "c 5"]  # the new outputs, not the superseded ones
    attempts = [(s.step_name, s.attempt, s.outcome) for s in steps_of(run) if s.step_name in ("b", "c")]
    assert attempts == [
        ("b", 1, StepOutcomeKind.SUCCESS),  # superseded: it stays in the history
        ("c", 1, StepOutcomeKind.FAILED),
        ("b", 2, StepOutcomeKind.SUCCESS),
        ("c", 2, StepOutcomeKind.SUCCESS),
    ]


@durable(name="durable_rewound_branch", allow_multiple=True)
def rewound_branch(ctx):
    first = ctx.step("first", effect("first"))
    if first.endswith("1"):
        ctx.step("old_branch", effect("old_branch"))
        ctx.step("stop", effect("stop"))
    return ctx.step("new_branch", effect("new_branch"))


def test_a_rewound_run_may_take_another_branch_after_the_checkpoint(helpers):
    FAILING.add("stop")
    run = rewound_branch.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    FAILING.clear()
    operator.resume_at(run.record.pk, "first")  # "first" returns "first 4" now: the other branch
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert labels() == ["first", "old_branch", "stop", "first", "new_branch"]


def test_resume_at_a_checkpoint_the_run_did_not_reach_is_refused(helpers):
    FAILING.add("b")
    run = rewound.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    with pytest.raises(StepNotDefined, match="'c' was not reached"):
        operator.resume_at(run.record.pk, "c")
    assert run.reload().status == RunStatus.PAUSED
    assert [s.status for s in steps_of(run)][-1] == StepStatus.FAILED


def test_the_admin_offers_the_checkpoints_the_run_reached_to_resume_at_and_fork_from(
    helpers, client, django_user_model
):
    client.force_login(staff_user(django_user_model, "rita", *VIEW, "skip_workflowrun", "rerun_workflowrun"))
    FAILING.add("b")
    run = rewound.start(None)
    helpers.speedrun_workflow(run)
    for verb in ("resume_at", "fork"):
        form = client.get(operation_url(run, verb)).content.decode()
        assert '<option value="a"' in form and '<option value="b"' in form
        assert '<option value="c"' not in form and "@function" not in form
    FAILING.clear()
    client.post(operation_url(run, "resume_at"), {"step": "a", "reason": "rewind"})
    assert run.reload().status == RunStatus.READY
    helpers.speedrun_workflow(run)
    assert labels() == ["a", "b", "a", "b", "c"]
