"""A debounced class started as a child of a fan-out is not debounced: one run per ``Child``, due at once.

Debounce collapses ``start()`` calls; a parent's children are each a job the parent waits for
and reads a result from, so collapsing two of them would leave a job without its run.
"""

from datetime import timedelta

import pytest

from pgbus_workflows import Child, Debounce, Workflow, fan_out, step
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import kinds

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()


class AccountPush(Workflow):
    """Debounced when started on its own: one run per account."""

    name = "debounce_children_push"
    allow_multiple = True
    step_options = {"queue": "debounce_children"}
    debounce = Debounce(period=timedelta(minutes=10), key=lambda wf: f"account:{wf.arguments['account_id']}")

    @step
    def push(self):
        return {"n": self.arguments["n"]}


class PushThrice(Workflow):
    """A parent whose fan-out starts three AccountPush children of one debounce key."""

    name = "debounce_children_parent"
    step_options = {"queue": "debounce_children"}

    @fan_out
    def pushes(self):
        return [Child(AccountPush, account_id=1, n=n) for n in range(3)]

    @step
    def gather(self):
        self.finished([result["n"] for result in self.fan_out_results("pushes")])


def _children(parent):
    return list(WorkflowRun.objects.filter(parent_id=parent.record.pk).order_by("pk"))


def test_each_child_of_a_debounced_class_is_its_own_run_due_at_once_and_never_collapses():
    pending = AccountPush.start(account_id=1, n=-1)  # a start on its own, not begun: children pass it by
    parent = helpers.perform_next_step(PushThrice.start())

    children = _children(parent)
    assert [child.arguments["n"] for child in children] == [0, 1, 2]
    assert {child.debounce_key for child in children} == {None}
    for child in children:
        first = WorkflowStep.objects.get(run_id=child.pk)
        assert first.scheduled_at == child.created_at  # no debounce period
    assert not WorkflowEvent.objects.filter(kind="debounced").exists()
    assert WorkflowRun.objects.get(pk=pending.record.pk).arguments == {"account_id": 1, "n": -1}

    later = AccountPush.start(account_id=1, n=9)  # collapses into the start on its own, not into a child
    assert later.debounced and later.workflow_id == pending.workflow_id
    assert all("debounced" not in kinds(AccountPush(child)) for child in children)

    helpers.complete_fan_out(parent)
    helpers.speedrun_workflow(parent)
    assert parent.status == "finished"
    assert parent.result() == [0, 1, 2]
