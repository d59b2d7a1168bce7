"""Forking a durable run where an operator forks: the admin's button and bulk action, the CLI, MCP's ``fork_run``.

Each surface forks a run paused at a failed checkpoint from that checkpoint (docs/durable.md,
"Rewinding and forking"; docs/operating.md, "Fork a run"). The fork's rows are asserted: the
earlier checkpoint copied from the original (not called again), the fork starting at the
checkpoint, and, once run, the bodies that ran and the result.
"""

from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.messages.constants import SUCCESS
from django.test import override_settings
from django.urls import reverse

from pgbus_workflows import durable
from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.states import RunStatus
from tests.management.test_cli import cli, refusal, wid
from tests.mcp.session import answer, tool_error
from tests.support import VIEW, events_of, labels, messages_of, operation_url, record, run_page, staff_user

pytestmark = pytest.mark.django_db

#: While True, the ``charge`` checkpoint's body raises (the bug an operator forks past once fixed).
BROKEN = {"charge": False}


def _body(label: str, value: Any) -> Any:
    def body() -> Any:
        record(label)
        if BROKEN.get(label):
            raise RuntimeError(f"{label} is broken")
        return value

    return body


@durable(name="durable_fork_surfaces", allow_multiple=True)
def fork_surfaces(ctx, amount):
    """Fetch, then charge (broken on demand), then a receipt: its result names all three."""
    fetched = ctx.step("fetch", _body("fetch", {"amount": amount}))
    charged = ctx.step("charge", _body("charge", fetched["amount"] * 2))
    return {"fetched": fetched, "charged": charged, "receipt": ctx.step("receipt", _body("receipt", "sent"))}


@pytest.fixture
def paused(helpers):
    """A factory of runs paused at ``charge`` (its body raised); ``charge`` is mended before the test acts."""
    BROKEN["charge"] = True

    def make(amount: int = 21):
        wf = helpers.speedrun_workflow(fork_surfaces.start(None, amount=amount))
        assert (wf.reload().status, wf.record.current_step) == (RunStatus.PAUSED, "charge")
        return wf

    yield make
    BROKEN["charge"] = False


def assert_forked_at_charge(helpers, original, actor: str, reason: str) -> None:
    """The fork's rows, then its run: ``fetch`` copied and replayed, ``charge`` and ``receipt`` run."""
    fork_row = WorkflowRun.objects.get(forked_from=original.workflow_id)
    assert (fork_row.workflow_class, fork_row.current_step, fork_row.status) == (
        "durable_fork_surfaces",
        "charge",
        RunStatus.READY,
    )
    copied = list(WorkflowStep.objects.filter(run_id=fork_row.pk).order_by("pk"))
    assert [(s.step_name, s.status, s.claimed_by, s.output) for s in copied] == [
        ("fetch", "completed", f"copied from {original.workflow_id}", {"amount": original.arguments["amount"]}),
        ("charge", "scheduled", "", None),
    ]
    (forked,) = events_of(original, "forked")
    assert (forked.actor, forked.reason, forked.details["from_step"]) == (actor, reason, "charge")
    before = len(labels())
    fork = helpers.speedrun_workflow(fork_surfaces.find(fork_row.workflow_id))
    amount = original.arguments["amount"]
    assert fork.result() == {"fetched": {"amount": amount}, "charged": amount * 2, "receipt": "sent"}
    assert labels()[before:] == ["charge", "receipt"]  # fetch replayed from the copy, not called


def test_the_run_page_forks_a_durable_run_at_a_checkpoint_it_reached(helpers, paused, client, django_user_model):
    client.force_login(staff_user(django_user_model, "fiona", *VIEW, "rerun_workflowrun"))
    original = paused()
    BROKEN["charge"] = False

    assert operation_url(original, "fork") in client.get(run_page(original)).content.decode()
    form = client.get(operation_url(original, "fork")).content.decode()
    assert '<option value="fetch">fetch</option>' in form and '<option value="charge">charge</option>' in form
    assert 'value="receipt"' not in form  # not reached: the form offers what the run reached
    response = client.post(operation_url(original, "fork"), {"from_step": "charge", "reason": "charge fixed"})

    assert response.status_code == 302
    assert_forked_at_charge(helpers, original, "fiona", "charge fixed")


def test_the_bulk_action_forks_each_selected_durable_run_at_the_checkpoint(helpers, paused, client, django_user_model):
    client.force_login(staff_user(django_user_model, "fiona", *VIEW, "rerun_workflowrun"))
    runs = [paused(amount=1), paused(amount=2)]
    BROKEN["charge"] = False

    response = client.post(
        reverse("admin:pgbus_workflows_workflowrun_changelist"),
        {
            "action": "fork_runs",
            "index": "0",
            ACTION_CHECKBOX_NAME: [wf.record.pk for wf in runs],
            "post": "yes",
            "from_step": "charge",
            "reason": "incident 12",
        },
    )

    assert messages_of(response) == [(SUCCESS, "2 forked")]
    for wf in runs:
        assert_forked_at_charge(helpers, wf, "fiona", "incident 12")


def test_the_cli_forks_a_durable_run_at_a_checkpoint(helpers, paused):
    original = paused()
    BROKEN["charge"] = False

    out, _err = cli("fork", wid(original), "--from-step", "charge", "--actor", "alice", "--reason", "charge fixed")

    fork = WorkflowRun.objects.get(forked_from=original.workflow_id)
    assert out.strip() == f"{wid(original)}  fork as {fork.workflow_id} from step charge (ready)"
    assert_forked_at_charge(helpers, original, "alice", "charge fixed")


def test_mcp_fork_run_forks_a_durable_run_at_a_checkpoint(helpers, paused):
    original = paused()
    BROKEN["charge"] = False

    with override_settings(PGBUS_WORKFLOWS={**settings.PGBUS_WORKFLOWS, "MCP_WRITE_TOOLS": True}):
        done = answer("fork_run", {"workflow_id": wid(original), "from_step": "charge", "reason": "charge fixed"})

    assert (done["ok"], done["verb"], done["new_status"]) == (True, "fork", "ready")
    assert done["new_run"] == str(WorkflowRun.objects.get(forked_from=original.workflow_id).workflow_id)
    assert_forked_at_charge(helpers, original, "mcp:claude-test", "charge fixed")


def test_every_surface_refuses_a_checkpoint_the_run_did_not_reach(paused, client, django_user_model):
    original = paused()
    client.force_login(staff_user(django_user_model, "fiona", *VIEW, "rerun_workflowrun"))

    form = client.post(operation_url(original, "fork"), {"from_step": "receipt", "reason": "x"})
    bulk = client.post(
        reverse("admin:pgbus_workflows_workflowrun_changelist"),
        {"action": "fork_runs", "index": "0", ACTION_CHECKBOX_NAME: [original.record.pk], "post": "yes"}
        | {"from_step": "receipt", "reason": "x"},
    )
    cli_message = refusal("fork", wid(original), "--from-step", "receipt")
    with override_settings(PGBUS_WORKFLOWS={**settings.PGBUS_WORKFLOWS, "MCP_WRITE_TOOLS": True}):
        mcp_message = tool_error("fork_run", {"workflow_id": wid(original), "from_step": "receipt", "reason": "x"})

    assert form.status_code == 200 and form.context["form"].errors["from_step"]
    ((_level, bulk_message),) = messages_of(bulk)
    assert bulk_message.startswith("0 forked; 1 unchanged: "), bulk_message
    for message in (bulk_message, cli_message, mcp_message):
        assert "Checkpoint 'receipt' was not reached" in message and "Reached: fetch, charge" in message, message
    assert not WorkflowRun.objects.filter(forked_from=original.workflow_id).exists()
