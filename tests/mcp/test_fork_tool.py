"""The write tool ``fork_run`` through the SDK's client (docs/mcp.md, ``fork_run``)."""

import pytest
from django.conf import settings
from django.test import override_settings

from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.testing import WorkflowTestMixin
from tests.management.test_cli import wid
from tests.mcp.session import CLIENT, answer, tool_error
from tests.support import VIEW, events_of, snapshot, staff_user
from tests.testapp.models import Order
from tests.testapp.workflows import ThreeSteps

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("write_tools")]

helpers = WorkflowTestMixin()


@pytest.fixture
def write_tools():
    with override_settings(PGBUS_WORKFLOWS={**settings.PGBUS_WORKFLOWS, "MCP_WRITE_TOOLS": True}):
        yield


def finished():
    return helpers.speedrun_workflow(ThreeSteps.start(Order.objects.create()))


def test_fork_run_starts_the_fork_at_the_step_recorded_with_the_client_and_the_reason():
    wf = finished()

    done = answer("fork_run", {"workflow_id": wid(wf), "from_step": "three", "reason": "step three fixed"})

    fork = WorkflowRun.objects.get(forked_from=wf.workflow_id)
    assert (done["ok"], done["verb"], done["new_run"], done["new_status"]) == (
        True,
        "fork",
        str(fork.workflow_id),
        "ready",
    )
    assert fork.current_step == "three"
    assert [(e.actor, e.reason) for e in events_of(wf, "forked")] == [(f"mcp:{CLIENT}", "step three fixed")]


def test_fork_run_refused_is_a_tool_error_and_changes_nothing():
    wf = finished()
    before = snapshot(wf)

    message = tool_error("fork_run", {"workflow_id": wid(wf), "from_step": "nope", "reason": "x"})

    assert message.endswith(
        f"{wid(wf)}: refused: Step 'nope' is not defined in three_steps. Available steps: one, two, three"
    )
    assert snapshot(wf) == before


def test_fork_run_needs_the_rerun_permission_as_user(django_user_model):
    staff_user(django_user_model, "pam", *VIEW, "pause_workflowrun")
    wf = finished()

    message = tool_error("fork_run", {"workflow_id": wid(wf), "reason": "x"}, as_user="pam")

    assert "pam may not fork it" in message and "rerun_workflowrun" in message
