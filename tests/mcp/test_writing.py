"""The write tools through the SDK's client, on PostgreSQL: the admin's verbs, their audit trail, their refusals.

Each verb is judged by the run's rows and its events: the actor is ``mcp:<client name>`` (or,
with ``--as-user``, the user's username) and the reason is the one the assistant gave. A verb
the run's state or the user's permissions refuse is a tool error and changes nothing.
"""

import pytest
from django.conf import settings
from django.test import override_settings

from pgbus_workflows.models import WorkflowSignal, WorkflowStep
from tests.management.test_cli import due_later, paused_on_error, ready, waiting, wid
from tests.mcp.session import CLIENT, answer, call, text, tool_error
from tests.support import VIEW, events_of, new_events, snapshot, staff_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("write_tools")]

ACTOR = f"mcp:{CLIENT}"
WHY = "the assistant saw it was stuck"


@pytest.fixture
def write_tools():
    with override_settings(PGBUS_WORKFLOWS={**settings.PGBUS_WORKFLOWS, "MCP_WRITE_TOOLS": True}):
        yield


@pytest.mark.parametrize(
    ("make", "tool", "extra", "status", "kinds"),
    [
        (ready, "pause_run", {}, "paused", ["paused"]),
        (paused_on_error, "resume_run", {}, "ready", ["resumed"]),
        (paused_on_error, "resume_at", {"step": "flaky"}, "ready", ["resumed_at"]),
        (ready, "cancel_run", {}, "cancelled", ["cancelled"]),
        (ready, "skip_step", {}, "ready", ["step_skipped"]),
        (due_later, "run_now", {}, "ready", ["run_now"]),
        (waiting, "signal_run", {"name": "approved", "payload": {"ok": True}}, "ready", ["signal_received"]),
    ],
)
def test_each_verb_is_the_admins_recorded_with_the_mcp_client_as_actor_and_the_reason_given(
    make, tool, extra, status, kinds
):
    wf = make()
    before = snapshot(wf)
    done = answer(tool, {"workflow_id": wid(wf), "reason": WHY, **extra})
    assert (done["run"], done["ok"], done["status"]) == (wid(wf), True, status)
    assert wf.reload().status == status
    recorded = [e for e in new_events(wf, before) if e.reason == WHY]
    assert [(e.kind, e.actor) for e in recorded] == [(kind, ACTOR) for kind in kinds]


def test_signal_run_delivers_the_payload_and_a_repeat_with_its_key_changes_nothing():
    wf = waiting()
    arguments = {"workflow_id": wid(wf), "name": "approved", "payload": {"n": 7}, "reason": WHY}
    first = answer("signal_run", {**arguments, "idempotency_key": "k-1"})
    assert (first["duplicate_delivery"], first["signal"]["name"]) == (False, "approved")
    signal = WorkflowSignal.objects.get(run_id=wf.record.pk)
    assert (signal.payload, signal.actor, signal.idempotency_key) == ({"n": 7}, ACTOR, "k-1")
    again = answer("signal_run", {**arguments, "idempotency_key": "k-1"})
    assert again["duplicate_delivery"] is True
    assert again["message"] == "already delivered with this idempotency key: nothing changed"
    assert WorkflowSignal.objects.filter(run_id=wf.record.pk).count() == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"name": " "}, "name\n  String should have at least 1 character"),
        ({"name": "x" * 256}, "name\n  String should have at most 255 characters"),
        ({"name": "approved", "payload": "x" * 5000}, "payload is 5002 bytes, over MAX_PAYLOAD_SIZE (4096 bytes)"),
        ({"name": "approved", "reason": ""}, "reason\n  String should have at least 1 character"),
        ({"name": "approved", "reason": "r" * 2001}, "reason\n  String should have at most 2000 characters"),
        ({"name": "approved", "idempotency_key": "k" * 256}, "idempotency_key must be at most 255 characters"),
        ({"name": "nope"}, "No step of approval waits for signal 'nope'"),
    ],
)
def test_signal_run_refuses_what_the_admins_form_refuses_and_changes_nothing(arguments, message):
    wf = waiting()
    before = snapshot(wf)
    assert message in tool_error("signal_run", {"workflow_id": wid(wf), "reason": WHY, **arguments})
    assert snapshot(wf) == before


def test_a_verb_the_runs_state_refuses_is_a_tool_error_with_the_verbs_message_and_changes_nothing():
    wf = ready()
    before = snapshot(wf)
    assert tool_error("resume_run", {"workflow_id": wid(wf), "reason": WHY}) == (
        f"Error executing tool resume_run: {wid(wf)}: refused: Cannot resume a ready workflow: it is not paused"
    )
    assert "refused: Cannot resume_at" in tool_error(
        "resume_at", {"workflow_id": wid(wf), "step": "two", "reason": WHY}
    )
    assert snapshot(wf) == before


def test_a_missing_run_or_a_missing_reason_is_a_tool_error():
    missing = "0123456789abcdef0123456789abcdef"
    assert tool_error("pause_run", {"workflow_id": missing, "reason": WHY}) == (
        f"Error executing tool pause_run: {missing}: refused: No workflow run {missing}"
    )
    wf = ready()
    assert "reason\n  Field required" in tool_error("pause_run", {"workflow_id": wid(wf)})
    assert wf.reload().status == "ready"


def test_the_actor_names_the_client_on_one_line_and_a_nameless_client_is_the_assistant():
    first, second = ready(), ready()
    answer("pause_run", {"workflow_id": wid(first), "reason": WHY}, client="Claude\nDesktop ")
    answer("pause_run", {"workflow_id": wid(second), "reason": WHY}, client="")
    assert [e.actor for e in events_of(first, "paused")] == ["mcp:Claude Desktop"]
    assert [e.actor for e in events_of(second, "paused")] == ["mcp:assistant"]


# -- --as-user -------------------------------------------------------------------------------------


def test_as_a_user_without_the_verbs_permission_the_verb_is_refused_per_run(django_user_model):
    staff_user(django_user_model, "bob", *VIEW)
    wf = ready()
    before = snapshot(wf)
    assert tool_error("pause_run", {"workflow_id": wid(wf), "reason": WHY}, as_user="bob") == (
        f"Error executing tool pause_run: {wid(wf)}: refused: bob may not pause it (it needs the permission "
        "pgbus_workflows.pause_workflowrun and the view permission on the run)"
    )
    assert snapshot(wf) == before


def test_as_a_user_with_the_permission_the_verb_is_recorded_under_their_username(django_user_model):
    staff_user(django_user_model, "carol", *VIEW, "pause_workflowrun")
    wf = ready()
    before = snapshot(wf)
    answer("pause_run", {"workflow_id": wid(wf), "reason": WHY}, as_user="carol")
    assert [(e.kind, e.actor, e.reason) for e in new_events(wf, before)] == [("paused", "carol", WHY)]
    # resume at a step takes the skip permission, as in the admin and the CLI
    assert "carol may not resume at it" in tool_error(
        "resume_at", {"workflow_id": wid(wf), "step": "two", "reason": WHY}, as_user="carol"
    )
    assert wf.reload().status == "paused"


def test_as_a_user_who_is_not_staff_every_call_is_refused(django_user_model):
    django_user_model.objects.create_user(username="frank", password="x")
    wf = ready()
    result = call("pause_run", {"workflow_id": wid(wf), "reason": WHY}, as_user="frank")
    assert result.is_error
    assert text(result) == (
        "Error executing tool pause_run: --as-user: frank may not use the admin (they must be active and staff)"
    )
    assert WorkflowStep.objects.get(run_id=wf.record.pk).status == "scheduled"
