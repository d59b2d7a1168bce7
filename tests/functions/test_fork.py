"""``wf.fork(from_step=...)`` of a durable run: the new run keeps the checkpoints before ``from_step`` and starts there.

The rows (copied checkpoints, the fork's link, the audit events on both runs) and the side
effects are asserted.
"""

import pytest

from pgbus_workflows import StepFailed, StepNotDefined, durable
from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.states import RunStatus, StepOutcomeKind
from tests.functions.bodies import FAILING
from tests.functions.bodies import effect as plain_effect
from tests.management.test_cli import cli, wid
from tests.support import events_of, labels, steps_of

pytestmark = pytest.mark.django_db


def effect(label):
    """A checkpoint body that returns its label and how many bodies had run (``bodies.effect``)."""
    return plain_effect(label, counted=True)


@durable(name="durable_forked", allow_multiple=True)
def forked(ctx, n):
    pages = [ctx.step("page", effect(f"page {i}")) for i in range(n)]
    try:
        ctx.step("charge", effect("charge"), on_exception="raise")
    except StepFailed:
        pages.append("charge raised")
    return [*pages, ctx.step("report", effect("report"))]


def test_a_fork_keeps_the_checkpoints_before_from_step_and_runs_from_there(helpers):
    FAILING.update({"charge", "report"})
    original = forked.start(None, n=2)
    helpers.speedrun_workflow(original)
    assert original.reload().status == RunStatus.PAUSED  # at "report"
    FAILING.clear()
    fork = original.fork(from_step="page#2", actor="ops", reason="page 1 was wrong")
    assert fork.record.forked_from == original.workflow_id
    helpers.speedrun_workflow(fork)
    assert fork.reload().status == RunStatus.FINISHED
    # "page" kept its output; "page#2", "charge" and "report" ran again in the fork.
    assert fork.result() == ["page 0 1", "page 1 5", "report 7"]  # charge ran (label 6), succeeded
    assert labels() == ["page 0", "page 1", "charge", "report", "page 1", "charge", "report"]
    (copied,) = events_of(fork, "step_copied")
    assert copied.details["original_step_id"] == steps_of(original)[0].pk
    (forked_from,) = events_of(fork, "forked_from")
    assert forked_from.details["copied_steps"] == ["page"]
    assert forked_from.details["from_step"] == "page#2"
    (forked_event,) = events_of(original, "forked")
    assert forked_event.actor == "ops"
    assert forked_event.details["fork_workflow_id"] == str(fork.workflow_id)


def test_a_fork_keeps_a_failure_raised_into_the_function_and_replays_it(helpers):
    FAILING.update({"charge", "report"})
    original = forked.start(None, n=1)
    helpers.speedrun_workflow(original)
    FAILING.clear()
    fork = original.fork(from_step="report")
    helpers.speedrun_workflow(fork)
    assert fork.result() == ["page 0 1", "charge raised", "report 4"]
    assert labels() == ["page 0", "charge", "report", "report"]  # charge not called again: its failure kept
    charge = next(s for s in steps_of(fork) if s.step_name == "charge")
    assert charge.outcome == StepOutcomeKind.FAILED


def test_a_fork_without_from_step_runs_the_function_from_the_top(helpers):
    original = forked.start(None, n=1)
    helpers.speedrun_workflow(original)
    fork = original.fork()
    helpers.speedrun_workflow(fork)
    assert fork.reload().status == RunStatus.FINISHED
    assert labels() == ["page 0", "charge", "report", "page 0", "charge", "report"]
    assert not events_of(fork, "step_copied")


def test_a_fork_at_a_checkpoint_the_run_did_not_reach_is_refused(helpers):
    original = forked.start(None, n=1)
    helpers.speedrun_workflow(original)
    with pytest.raises(StepNotDefined, match="'page#2' was not reached"):
        original.fork(from_step="page#2")


def test_the_cli_forks_a_durable_run_at_a_checkpoint(helpers):
    original = forked.start(None, n=2)
    helpers.speedrun_workflow(original)
    cli("fork", wid(original), "--from-step", "charge", "--reason", "charge fixed")
    fork = forked.find(WorkflowRun.objects.get(forked_from=original.workflow_id).workflow_id)
    helpers.speedrun_workflow(fork)
    assert fork.reload().status == RunStatus.FINISHED
    assert labels() == ["page 0", "page 1", "charge", "report", "charge", "report"]
