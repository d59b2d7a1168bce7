"""``ctx.child``: a child run started once from a durable function; the run parks until it ended.

Children of a step class and of a durable function, run in process by ``complete_fan_out``;
the child is the same run on every replay, never a second.
"""

import pytest

from pgbus_workflows import StepFailed, durable
from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.states import RunStatus, StepStatus
from tests.support import VIEW, run_page, staff_user, steps_of
from tests.testapp.durable_workflows import Doubler, durable_gather, durable_tripler
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db


def calls(label):
    return SideEffect.objects.filter(label=label).count()


@durable(name="child_parent", allow_multiple=True)
def parent(ctx, n, cancel=False):
    return {"doubled": ctx.child("double", Doubler, None, n=n, cancel=cancel)}


@durable(name="child_raising_parent", allow_multiple=True)
def raising_parent(ctx, n):
    try:
        return ctx.child("double", Doubler, None, n=n, cancel=True, on_exception="raise")
    except StepFailed as failure:
        return {"failed": failure.step, "message": failure.message}


def until_parked(helpers, run):
    while run.reload().status == RunStatus.READY:
        helpers.perform_next_step(run)
    assert run.reload().status == RunStatus.WAITING
    return WorkflowStep.objects.get(run_id=run.record.pk, status=StepStatus.WAITING)


def test_child_starts_one_run_parks_until_it_finished_and_returns_its_result(helpers):
    run = parent.start(None, n=4)
    parked = until_parked(helpers, run)
    assert (parked.step_name, parked.fan_out_total) == ("double", 1)
    (child,) = run.children
    assert child.record.workflow_class == "durable_doubler"
    assert child.parent.record.pk == run.record.pk
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"doubled": 8}
    assert WorkflowRun.objects.filter(parent_id=run.record.pk).count() == 1  # replays started no second child
    assert calls("double") == 1
    recorded = next(s for s in steps_of(run) if s.step_name == "double")
    assert (recorded.status, recorded.output) == (StepStatus.COMPLETED, 8)


def test_a_durable_function_is_a_child_too_and_map_and_children_chain(helpers):
    run = durable_gather.start(None, numbers=[1, 2])
    for _ in range(3):  # the map, then each child
        until_parked(helpers, run)
        helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.result() == {"squares": [1, 4], "doubled": 10, "tripled": 30}
    kinds = [c.record.workflow_class for c in run.children]
    assert kinds == ["durable_doubler", "durable_tripler"]
    assert run.children[1].result() == 30
    assert durable_tripler.name == "durable_tripler" and Doubler.name == "durable_doubler"


def test_a_cancelled_child_pauses_the_parent_at_the_child_by_default(helpers):
    run = parent.start(None, n=1, cancel=True)
    until_parked(helpers, run)
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    failed = steps_of(run)[-1]
    assert (failed.step_name, failed.error_class) == ("double", "pgbus_workflows.exceptions.FanOutFailed")
    assert "1 of 1 children of double failed" in failed.error_message
    # Resume re-attaches the same (cancelled) child, as a child step's reattempt does: never a second.
    run.resume()
    until_parked(helpers, run)
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    assert WorkflowRun.objects.filter(parent_id=run.record.pk).count() == 1


def test_on_exception_raise_raises_step_failed_for_a_cancelled_child(helpers):
    run = raising_parent.start(None, n=1)
    until_parked(helpers, run)
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    result = run.result()
    assert result["failed"] == "double"
    assert result["message"].startswith("1 of 1 children of double failed (first: Child run ")


def test_cancelling_the_parent_cancels_the_child(helpers):
    run = parent.start(None, n=1)
    until_parked(helpers, run)
    run.cancel()
    (child,) = run.children
    assert child.reload().status == RunStatus.CANCELLED


def test_a_class_that_is_not_a_workflow_is_refused(helpers):
    @durable(name="child_of_nothing", allow_multiple=True)
    def orphan(ctx):
        return ctx.child("x", dict, None)

    run = orphan.start(None)
    helpers.speedrun_workflow(run)
    assert "ctx.child('x') takes a Workflow subclass" in steps_of(run)[-1].error_message


def test_the_admin_run_page_links_the_child_and_counts_it_on_its_checkpoint(helpers, client, django_user_model):
    client.force_login(staff_user(django_user_model, "vera", *VIEW))
    run = parent.start(None, n=2)
    until_parked(helpers, run)
    (child,) = run.children
    html = client.get(run_page(run)).content.decode()
    assert run_page(child) in html  # the children panel links the child run
    assert "double" in html
    page = client.get(run_page(child)).content.decode()
    assert run_page(run) in page  # and the child's page links its parent


@durable(name="child_abandoning_parent", allow_multiple=True)
def abandoning(ctx, n):
    return ctx.child("double", Doubler, None, n=n, parent_close="abandon")


def test_parent_close_abandon_leaves_the_child_running_when_the_parent_is_cancelled(helpers):
    run = abandoning.start(None, n=1)
    until_parked(helpers, run)
    run.cancel()
    (child,) = run.children
    assert child.reload().status == RunStatus.READY
    assert child.record.parent_close == "abandon"


def test_a_paused_child_is_still_running_for_its_parent(helpers):
    run = parent.start(None, n=3)
    until_parked(helpers, run)
    (child,) = run.children
    child.pause()
    assert run.reload().status == RunStatus.WAITING
    child.resume()
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.result() == {"doubled": 6}
