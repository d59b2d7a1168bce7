"""Child workflows in the admin: a run's page shows its parent and its children, the fan-out counts children."""

import pytest
from django.urls import reverse

from pgbus_workflows.admin.run_page import PAGE_ROWS
from pgbus_workflows.exceptions import StepWaiting
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import VIEW, run_page, staff_user
from tests.testapp.child_workflows import Many
from tests.testapp.workflows import Squares

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(staff_user(django_user_model, "vera", *VIEW))
    return client


def test_a_parent_page_lists_its_children_with_their_statuses_and_counts_them(viewer):
    parent = helpers.perform_next_step(Many.start(count=3))
    first, *_ = parent.children
    helpers.speedrun_workflow(first)
    html = viewer.get(run_page(parent)).content.decode()
    assert 'id="family"' in html
    assert html.count('<tr class="pgbus-child">') == 3
    assert str(first.workflow_id)[:8] in html
    assert "3 children:" in html
    assert "fan-out: 1 done / 0 failed / 3 children" in html
    assert f"?parent__id__exact={parent.record.pk}" in html


def test_one_child_and_one_job_are_said_in_the_singular(viewer):
    parent = helpers.perform_next_step(Many.start(count=1))
    html = viewer.get(run_page(parent)).content.decode()
    assert "1 child:" in html
    assert "fan-out: 0 done / 0 failed / 1 child<" in html
    assert "1 children" not in html
    squares = helpers.perform_next_step(Squares.start(count=1))
    html = viewer.get(run_page(squares)).content.decode()
    assert "fan-out: 0 done / 0 failed / 1 job<" in html
    assert "1 jobs" not in html


def test_a_child_page_links_to_its_parent(viewer):
    parent = helpers.perform_next_step(Many.start(count=1))
    [child] = parent.children
    html = viewer.get(run_page(child)).content.decode()
    assert "Started by" in html
    assert run_page(parent) in html


def test_a_run_without_family_has_no_such_section(viewer):
    html = viewer.get(run_page(Many.start(count=1))).content.decode()
    assert 'id="family"' not in html


def test_the_page_lists_a_page_of_children_and_says_how_many_more(viewer):
    parent = helpers.perform_next_step(Many.start(count=PAGE_ROWS + 5))
    html = viewer.get(run_page(parent)).content.decode()
    assert html.count('<tr class="pgbus-child">') == PAGE_ROWS
    assert "and 5 more" in html
    children = viewer.get(f"/admin/pgbus_workflows/workflowrun/?parent__id__exact={parent.record.pk}")
    assert children.status_code == 200
    assert children.content.decode().count(str(parent.children[0].workflow_id)[:8]) >= 1


def test_the_dashboard_counts_children_going_on_under_paused_parents(viewer):
    paused = helpers.perform_next_step(Many.start(count=3))
    helpers.speedrun_workflow(paused.children[0])  # ended: no longer counted
    paused.pause()
    helpers.perform_next_step(Many.start(count=2))  # its parent is not paused: not counted
    html = viewer.get(reverse("admin:pgbus_workflows_workflowrun_dashboard")).content.decode()
    assert "2 child runs go on under" in html
    assert "paused parents</a>" in html


def test_the_dashboard_says_nothing_of_children_when_no_run_is_paused(viewer):
    helpers.perform_next_step(Many.start(count=2))
    html = viewer.get(reverse("admin:pgbus_workflows_workflowrun_dashboard")).content.decode()
    assert "pgbus-children-of-paused" not in html


def test_the_test_helpers_say_one_child_and_one_job_in_the_singular():
    for started, words in (
        (Many.start(count=1), "'s 1 child, 1 ongoing"),
        (Squares.start(count=1), "'s 1 fan-out job:"),
    ):
        wf = helpers.perform_next_step(started)
        with pytest.raises(StepWaiting) as caught:
            helpers.speedrun_workflow(wf)
        assert words in str(caught.value)
