"""Forking from the admin: a run page's "Fork" button and the runs list's bulk action.

docs/operating.md, "Fork a run".
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.messages.constants import SUCCESS, WARNING
from django.urls import reverse

from pgbus_workflows import Workflow, step
from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import VIEW, messages_of, operation_url, run_page, snapshot, staff_user

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()


class AdminForkable(Workflow):
    name = "admin_forkable"
    allow_multiple = True

    @step
    def first(self):
        return {"n": 1}

    @step
    def second(self):
        return {"n": self.outputs["first"]["n"] + 1}


class AdminOtherSteps(Workflow):
    name = "admin_other_steps"
    allow_multiple = True

    @step
    def only(self):
        return None


def finished(cls: type[Workflow] = AdminForkable) -> Workflow:
    wf = helpers.speedrun_workflow(cls.start(None))
    assert wf.status == "finished"
    return wf


def changelist() -> str:
    return reverse("admin:pgbus_workflows_workflowrun_changelist")


@pytest.fixture
def forker(client: Any, django_user_model: Any) -> Any:
    """A staff user who may view runs and rerun (which governs forks too)."""
    client.force_login(staff_user(django_user_model, "fiona", *VIEW, "rerun_workflowrun"))
    return client


def test_the_run_page_offers_fork_and_its_form_lists_the_class_steps(forker):
    wf = finished()

    html = forker.get(run_page(wf)).content.decode()
    assert operation_url(wf, "fork") in html

    form = forker.get(operation_url(wf, "fork")).content.decode()
    assert '<option value="first">first</option>' in form and '<option value="second">second</option>' in form
    assert 'name="reason"' in form


def test_the_fork_button_starts_the_fork_and_goes_to_its_page(forker):
    wf = finished()

    response = forker.post(operation_url(wf, "fork"), {"from_step": "second", "reason": "fixed"}, follow=True)

    fork = WorkflowRun.objects.get(forked_from=wf.workflow_id)
    assert (fork.current_step, fork.status) == ("second", "ready")
    assert response.redirect_chain[-1][0] == reverse("admin:pgbus_workflows_workflowrun_change", args=[fork.pk])
    html = response.content.decode()
    assert f"Fork started as run {fork.workflow_id}." in html
    assert f'<a href="{run_page(wf)}">{wf.workflow_id}</a>' in html  # "forked from", linked
    assert [(e.actor, e.reason) for e in wf.events.filter(kind="forked")] == [("fiona", "fixed")]


def test_a_step_not_in_the_form_is_refused_by_the_form(forker):
    wf = finished()
    before = snapshot(wf)

    response = forker.post(operation_url(wf, "fork"), {"from_step": "nope", "reason": "fixed"})

    assert response.status_code == 200 and response.context["form"].errors["from_step"]
    assert snapshot(wf) == before and not WorkflowRun.objects.filter(forked_from=wf.workflow_id).exists()


def test_without_the_rerun_permission_there_is_no_button_and_the_form_is_refused(client, django_user_model):
    client.force_login(staff_user(django_user_model, "paul", *VIEW, "pause_workflowrun"))
    wf = finished()

    assert operation_url(wf, "fork") not in client.get(run_page(wf)).content.decode()
    assert client.get(operation_url(wf, "fork")).status_code == 403
    assert client.post(operation_url(wf, "fork"), {"from_step": "first", "reason": "x"}).status_code == 403


def bulk_post(client: Any, runs: list[Workflow], **extra: str) -> Any:
    data = {"action": "fork_runs", "index": "0", ACTION_CHECKBOX_NAME: [wf.record.pk for wf in runs], **extra}
    return client.post(changelist(), data)


def test_the_bulk_action_forks_at_one_step_and_leaves_the_runs_without_it_alone(forker):
    forkable = [finished(), finished()]
    other = finished(AdminOtherSteps)
    gone = finished()
    WorkflowRun.objects.filter(pk=gone.record.pk).update(workflow_class="admin_gone_class")
    befores = [snapshot(wf)[:4] for wf in (other, gone)]  # their own rows: the others' forks add rows

    confirmation = bulk_post(forker, [*forkable, other, gone])
    assert confirmation.status_code == 200
    html = confirmation.content.decode()
    assert 'name="from_step"' in html and 'name="reason"' in html

    response = bulk_post(forker, [*forkable, other, gone], post="yes", from_step="second", reason="incident 9")

    assert response.status_code == 302
    ((level, text),) = messages_of(response)
    assert level == WARNING
    assert text.startswith("2 forked; "), text
    assert "1 unchanged: Step 'second' is not defined in admin_other_steps. Available steps: only" in text
    assert "1 unchanged: Cannot fork" in text and "'admin_gone_class' is not registered" in text
    for wf in forkable:
        fork = WorkflowRun.objects.get(forked_from=wf.workflow_id)
        assert (fork.current_step, fork.status) == ("second", "ready")
    assert [snapshot(wf)[:4] for wf in (other, gone)] == befores
    assert not WorkflowRun.objects.filter(forked_from__in=[other.workflow_id, gone.workflow_id]).exists()


def test_the_bulk_action_reports_success_when_every_run_forks(forker):
    runs = [finished(), finished()]

    response = bulk_post(forker, runs, post="yes", from_step="first", reason="again")

    ((level, text),) = messages_of(response)
    assert (level, text) == (SUCCESS, "2 forked")
    assert WorkflowRun.objects.filter(forked_from__in=[wf.workflow_id for wf in runs]).count() == 2


def test_the_bulk_action_is_refused_without_the_rerun_permission(client, django_user_model):
    client.force_login(staff_user(django_user_model, "paul", *VIEW, "pause_workflowrun"))
    wf = finished()

    assert 'value="fork_runs"' not in client.get(changelist()).content.decode()
    assert bulk_post(client, [wf], post="yes", from_step="first", reason="x").status_code == 403


def test_the_fork_page_marks_the_copied_attempts_with_the_run_they_came_from(forker):
    wf = finished()
    fork = wf.fork("second", actor="fiona")

    html = forker.get(run_page(fork)).content.decode()

    copied = f'copied from run <a href="{run_page(wf)}">{wf.workflow_id}</a>'
    assert html.count(copied) == 1  # "first" only: "second" is the fork's own attempt
    assert "step_copied" in html
