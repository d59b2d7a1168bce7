"""Holds in the admin: the dashboard's list, release buttons and hold form (with their permission), the banner."""

import pytest
from django.urls import reverse

from pgbus_workflows import hold_class, hold_queue
from pgbus_workflows.models import WorkflowHold
from tests.support import VIEW, messages_of, staff_user

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:pgbus_workflows_workflowrun_dashboard"
HOLDS = "admin:pgbus_workflows_workflowrun_holds"


def texts(response):
    return [text for _level, text in messages_of(response)]


def login(client, django_user_model, *codenames, name="bob"):
    client.force_login(staff_user(django_user_model, name, *codenames))


def test_the_dashboard_says_what_is_held_since_when_by_whom_and_why_with_a_release_button_for_who_may(
    client, django_user_model
):
    hold = hold_class("held_work", actor="ops", reason="mail down")
    hold_queue("free", actor="ops", reason="failover")
    login(client, django_user_model, *VIEW, "hold_workflowrun")

    html = client.get(reverse(DASHBOARD)).content.decode()

    section = html.split('id="holds"', 1)[1].split("</div>", 1)[0]
    since = hold.held_at.strftime("%Y-%m-%d %H:%M:%S")
    assert f"class held_work held since {since}" in section and "by ops: mail down" in section
    assert "queue free held since" in section
    assert section.count(">Release</button>") == 2 and 'id="hold-form"' in section


def test_without_the_permission_no_button_no_form_and_a_forged_post_is_refused(client, django_user_model):
    hold_class("held_work", actor="ops", reason="mail down")
    login(client, django_user_model, *VIEW)

    section = client.get(reverse(DASHBOARD)).content.decode().split('id="holds"', 1)[1].split("</div>", 1)[0]
    assert "held_work held since" in section and "Release" not in section and "hold-form" not in section

    response = client.post(reverse(HOLDS), {"action": "release", "kind": "class", "name": "held_work"})
    assert response.status_code == 403
    assert WorkflowHold.objects.active().count() == 1


def test_the_form_holds_and_the_button_releases_as_the_user_with_clear_messages_for_bad_input(
    client, django_user_model
):
    login(client, django_user_model, *VIEW, "hold_workflowrun", name="carol")

    response = client.post(reverse(HOLDS), {"action": "hold", "kind": "class", "name": "held_work", "reason": "r"})
    assert response.status_code == 302 and response.url == reverse(DASHBOARD)
    hold = WorkflowHold.objects.active().get()
    assert (hold.kind, hold.name, hold.held_by, hold.reason) == ("class", "held_work", "carol", "r")
    assert texts(response) == ["class held_work held."]

    response = client.post(reverse(HOLDS), {"action": "hold", "kind": "class", "name": "nope"})
    assert "No workflow class is registered as 'nope'" in texts(response)[-1]
    response = client.post(reverse(HOLDS), {"action": "hold", "kind": "queue", "name": ""})
    assert "A queue name is a non-empty string" in texts(response)[-1]
    response = client.post(reverse(HOLDS), {"action": "explode", "kind": "class", "name": "held_work"})
    assert texts(response)[-1] == "Choose hold or release, and a class or a queue."
    assert client.get(reverse(HOLDS)).status_code == 405

    response = client.post(reverse(HOLDS), {"action": "release", "kind": "class", "name": "held_work"})
    assert texts(response)[-1] == "class held_work released."
    assert WorkflowHold.objects.get().released_by == "carol"


def test_a_held_classs_runs_list_has_a_banner(client, django_user_model):
    login(client, django_user_model, *VIEW)
    url = reverse("admin:pgbus_workflows_workflowrun_changelist")
    assert "is held since" not in client.get(url, {"workflow_class": "held_work"}).content.decode()

    hold_class("held_work", actor="ops", reason="mail down")

    html = client.get(url, {"workflow_class": "held_work"}).content.decode()
    assert "held_work is held since" in html and "by ops: mail down" in html
    assert "is held since" not in client.get(url, {"workflow_class": "free_work"}).content.decode()
