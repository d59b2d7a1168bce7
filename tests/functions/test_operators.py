"""Operators and durable functions: pause stops the function before its next checkpoint, and the
admin run page and ``workflows show`` list the checkpoints as the run's steps.
"""

from io import StringIO

import pytest
from django.core.management import call_command

from pgbus_workflows import durable
from pgbus_workflows.services import operator
from pgbus_workflows.states import RunStatus, StepStatus
from tests.support import VIEW, labels, record, run_page, staff_user, steps_of

pytestmark = pytest.mark.django_db


def effect(label):
    """A checkpoint body: records ``label`` in the side effects table and returns it."""

    def body():
        record(label)
        return label

    return body


def paused_meanwhile(ctx):
    """A checkpoint body during which an operator pauses the run (under the run lock, as always)."""

    def body():
        record("first")
        operator.pause(paused_between.find(ctx.workflow_id).record.pk, reason="operator")
        return "first"

    return body


@durable(name="durable_paused_between", allow_multiple=True)
def paused_between(ctx):
    ctx.step("first", paused_meanwhile(ctx))
    ctx.step("second", effect("second"))
    return "done"


@durable(name="durable_listed", allow_multiple=True)
def listed(ctx, n):
    return [ctx.step("page", effect(f"page {i}")) for i in range(n)]


def test_pause_while_a_checkpoint_runs_stops_the_function_before_its_next_checkpoint(helpers):
    run = paused_between.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    assert labels() == ["first"]
    first = next(s for s in steps_of(run) if s.step_name == "first")
    assert first.status == StepStatus.COMPLETED  # its outcome was kept; nothing ran after it
    operator.resume(run.record.pk)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert labels() == ["first", "second"]


def test_workflows_show_lists_the_checkpoints(helpers):
    run = listed.start(None, n=2)
    helpers.speedrun_workflow(run)
    out = StringIO()
    call_command("workflows", "show", str(run.workflow_id), stdout=out)
    text = out.getvalue()
    assert "page#2" in text
    assert text.index("page") < text.index("page#2")


def test_the_admin_run_page_lists_the_checkpoints(helpers, client, django_user_model):
    client.force_login(staff_user(django_user_model, "vera", *VIEW))
    run = listed.start(None, n=2)
    helpers.speedrun_workflow(run)
    html = client.get(run_page(run)).content.decode()
    assert "page#2" in html
