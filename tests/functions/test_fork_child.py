"""Forking a child run: the fork is a top-level run, and the parent goes on waiting for the original child.

docs/durable.md, "Forking a child run": a fork is a copy to run on its own (as DBOS's
``fork_workflow`` of a child is); what mends a child in place, so that its parent gets its
result, is a resume or a ``resume_at`` of the child itself.
"""

import pytest

from pgbus_workflows import durable
from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.states import RunStatus
from tests.support import events_of, labels, record
from tests.testapp.child_workflows import ShipOrder
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

#: While True, the child's ``charge`` checkpoint raises.
BROKEN = {"charge": False}


def _body(label, value):
    def body():
        record(label)
        if BROKEN.get(label):
            raise RuntimeError(f"{label} is broken")
        return value

    return body


@durable(name="durable_fork_child", allow_multiple=True)
def charge_child(ctx, amount):
    """Fetch, then charge (broken on demand): returns twice the amount."""
    fetched = ctx.step("fetch", _body("fetch", amount))
    return ctx.step("charge", _body("charge", fetched * 2))


@durable(name="durable_fork_child_parent", allow_multiple=True)
def charging_parent(ctx, amount):
    """Starts ``charge_child`` and returns its result."""
    return {"charged": ctx.child("charge", charge_child, None, amount=amount)}


@pytest.fixture
def paused_child(helpers):
    """A parent waiting for its child, the child paused at ``charge``; ``charge`` mended before the test acts."""
    BROKEN["charge"] = True
    parent = helpers.perform_next_step(charging_parent.start(None, amount=5))
    assert parent.reload().status == RunStatus.WAITING
    (child,) = parent.children
    helpers.speedrun_workflow(child)
    assert (child.reload().status, child.record.current_step) == (RunStatus.PAUSED, "charge")
    BROKEN["charge"] = False
    yield parent, child
    BROKEN["charge"] = False


def test_a_fork_of_a_child_is_a_top_level_run_and_the_parent_waits_for_the_original(helpers, paused_child):
    parent, child = paused_child

    fork = child.fork(from_step="charge", actor="ops", reason="charge fixed")

    row = WorkflowRun.objects.get(pk=fork.record.pk)
    assert (row.parent_id, row.parent_job_id, row.parent_close, row.depth) == (None, None, "", 0)
    assert row.forked_from == child.workflow_id
    assert fork.parent is None
    assert [c.workflow_id for c in parent.children] == [child.workflow_id]  # the fork is not the parent's
    helpers.speedrun_workflow(fork)
    assert fork.result() == 10
    assert parent.reload().status == RunStatus.WAITING  # the fork's end is not the child's end
    assert child.reload().status == RunStatus.PAUSED
    assert events_of(child, "forked")[0].details["fork_workflow_id"] == str(fork.workflow_id)


def test_cancelling_the_parent_cancels_the_original_child_and_leaves_the_fork_alone(helpers, paused_child):
    parent, child = paused_child
    fork = child.fork(from_step="charge")

    parent.cancel(reason="order withdrawn")

    assert child.reload().status == RunStatus.CANCELLED
    assert fork.reload().status == RunStatus.READY
    helpers.speedrun_workflow(fork)
    assert fork.result() == 10


def test_resuming_the_child_itself_mends_it_for_its_parent(helpers, paused_child):
    parent, child = paused_child
    before = len(labels())

    child.resume(actor="ops", reason="charge fixed")
    helpers.complete_fan_out(parent)  # runs the child to its end, as a dispatcher would, and the parent on
    helpers.speedrun_workflow(parent)

    assert labels()[before:] == ["charge"]  # fetch replayed
    assert parent.reload().status == RunStatus.FINISHED
    assert parent.result() == {"charged": 10}


def test_a_fork_of_a_step_class_child_of_a_fan_out_is_a_top_level_run_too(helpers):
    order = Order.objects.create()
    parent = helpers.perform_next_step(ShipOrder.start(None, orders=[order.pk]))  # starts the child, parks
    (child,) = parent.children
    helpers.speedrun_workflow(child)

    fork = child.fork(from_step="ship")

    row = WorkflowRun.objects.get(pk=fork.record.pk)
    assert (row.parent_id, row.parent_job_id, row.parent_close, row.depth) == (None, None, "", 0)
    assert [c.workflow_id for c in parent.children] == [child.workflow_id]
    assert helpers.speedrun_workflow(fork).outputs["label"] == {"carrier": "dhl"}  # copied, not run again
    assert labels() == ["label"]
