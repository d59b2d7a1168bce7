"""The ``hold`` and ``release`` write tools through the SDK's client: the hold row, its actor, its refusals."""

import pytest
from django.conf import settings
from django.test import override_settings

from pgbus_workflows.models import WorkflowHold
from tests.mcp.session import CLIENT, answer, tool_error
from tests.support import VIEW, staff_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("write_tools")]

WHY = "the mail service is down"


@pytest.fixture
def write_tools():
    with override_settings(PGBUS_WORKFLOWS={**settings.PGBUS_WORKFLOWS, "MCP_WRITE_TOOLS": True}):
        yield


def test_hold_and_release_a_class_with_the_client_as_actor_and_the_reason_given():
    held = answer("hold", {"workflow_class": "held_work", "reason": WHY})
    assert (held["kind"], held["name"], held["held_by"]) == ("class", "held_work", f"mcp:{CLIENT}")
    assert WorkflowHold.objects.get().reason == WHY  # the reply redacts it, as it redacts every reason

    released = answer("release", {"workflow_class": "held_work", "reason": "back up"})
    assert released["released"] is True
    hold = WorkflowHold.objects.get()
    assert (hold.released_by, hold.release_reason) == (f"mcp:{CLIENT}", "back up")
    assert answer("release", {"workflow_class": "held_work", "reason": "again"}) == {"released": False}


def test_a_queue_too_and_one_target_exactly():
    assert answer("hold", {"queue": "held", "reason": WHY})["kind"] == "queue"
    assert tool_error("hold", {"reason": WHY}) == "Error executing tool hold: give one of workflow_class and queue"
    assert "give one of" in tool_error("hold", {"queue": "held", "workflow_class": "held_work", "reason": WHY})
    assert "No workflow class is registered as 'nope'" in tool_error("hold", {"workflow_class": "nope", "reason": WHY})
    assert "reason\n  Field required" in tool_error("hold", {"queue": "other"})
    assert WorkflowHold.objects.count() == 1


def test_as_a_user_without_the_hold_permission_it_is_refused(django_user_model):
    staff_user(django_user_model, "bob", *VIEW)
    assert "bob may not hold or release (permission pgbus_workflows.hold_workflowrun)" in tool_error(
        "hold", {"workflow_class": "held_work", "reason": WHY}, as_user="bob"
    )
    staff_user(django_user_model, "carol", *VIEW, "hold_workflowrun")
    assert answer("hold", {"workflow_class": "held_work", "reason": WHY}, as_user="carol")["held_by"] == "carol"
