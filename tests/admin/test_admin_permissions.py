"""The admin asks permissions per object: the verb's and the view permission on that very run.

Every operation form and bulk action, and the buttons, ask ``WorkflowRunAdmin.may_operate``
(the verb's ``has_<x>_permission(request, run)`` and ``has_view_permission(request, run)``);
object-level backends are asked with the run; a run page shows attempts, events and signals
only with their own view permissions, and the dashboard shows dispatchers only with theirs.
"""

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import override_settings
from django.urls import reverse

from pgbus_workflows.models import WorkflowEvent, WorkflowRun
from tests.admin.test_admin import failed_run, ready_run
from tests.support import VIEW, messages_of, operation_url, run_page, snapshot, staff_user
from tests.testapp.permissions import GRANTS

pytestmark = pytest.mark.django_db

ONLY_RUNS = ("view_workflowrun",)
BACKENDS = ["django.contrib.auth.backends.ModelBackend", "tests.testapp.permissions.PerRunBackend"]


def login(client: Any, django_user_model: Any, *codenames: str, name: str = "bob") -> Any:
    client.force_login(staff_user(django_user_model, name, *codenames))
    return client


def run_page_html(client: Any, wf: Any) -> str:
    """Fetch the run's admin page as ``client`` (it must answer 200); returns its HTML."""
    response = client.get(run_page(wf))
    assert response.status_code == 200
    return response.content.decode()


def test_a_pause_reason_holding_a_steps_error_is_shown_only_with_the_permission_to_view_attempts(
    client, django_user_model
):
    wf = failed_run()
    reason = WorkflowRun.objects.get(pk=wf.record.pk).paused_reason
    assert reason.endswith("Boom: first attempt fails")  # the step's error text, as the pause recorded it

    html = run_page_html(login(client, django_user_model, *ONLY_RUNS), wf)
    assert reason not in html
    assert "Withheld: it may hold a step&#x27;s error" in html

    html = run_page_html(login(client, django_user_model, "view_workflowrun", "view_workflowstep", name="carol"), wf)
    assert reason in html
    assert "Withheld" not in html


def test_an_events_error_text_is_shown_only_with_the_permission_to_view_attempts(client, django_user_model):
    wf = failed_run()
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="step_failed")
    assert event.details["error_message"] == "first attempt fails"  # the step's error, in the reason and details
    pages = (
        run_page(wf),
        reverse("admin:pgbus_workflows_workflowevent_changelist") + f"?run__id__exact={wf.record.pk}",
        reverse("admin:pgbus_workflows_workflowevent_change", args=[event.pk]),
    )

    login(client, django_user_model, "view_workflowrun", "view_workflowevent")
    for page in pages:
        html = client.get(page).content.decode()
        assert "first attempt fails" not in html, page
        assert "Withheld: it may hold a step&#x27;s error" in html, page
        assert "step_failed" in html, page  # the event itself is shown, its error's class too
    assert "tests.admin.test_admin.Boom" in client.get(pages[2]).content.decode()

    login(client, django_user_model, "view_workflowrun", "view_workflowevent", "view_workflowstep", name="carol")
    for page in pages:
        html = client.get(page).content.decode()
        assert "first attempt fails" in html, page
        assert "Withheld" not in html, page


def test_the_pause_permission_without_the_view_permission_opens_no_form_and_pauses_nothing(client, django_user_model):
    wf = ready_run()
    before = snapshot(wf)
    login(client, django_user_model, "pause_workflowrun")

    assert client.get(operation_url(wf, "pause")).status_code == 403
    assert client.post(operation_url(wf, "pause"), {"reason": "x"}).status_code == 403
    assert snapshot(wf) == before


def test_a_run_page_shows_attempts_events_and_signals_only_with_their_own_view_permissions(client, django_user_model):
    wf = failed_run()
    wf.signal("unused", {"secret": "payload-xyz"})
    html = run_page_html(login(client, django_user_model, *ONLY_RUNS), wf)
    for section in ('id="timeline"', 'id="events"', 'id="signals"', "Traceback", "payload-xyz"):
        assert section not in html, section

    html = run_page_html(login(client, django_user_model, *VIEW, name="carol"), wf)
    for section in ('id="timeline"', 'id="events"', 'id="signals"', "Traceback", "payload-xyz"):
        assert section in html, section


def test_the_dashboard_shows_dispatchers_only_with_their_view_permission(client, django_user_model):
    from pgbus_workflows.models import Dispatcher

    Dispatcher.objects.create(name="secret-host:1:abc", hostname="secret-host", pid=4242)
    url = reverse("admin:pgbus_workflows_workflowrun_dashboard")
    html = login(client, django_user_model, *ONLY_RUNS).get(url).content.decode()
    assert 'id="dispatchers"' not in html and "secret-host" not in html

    html = login(client, django_user_model, *ONLY_RUNS, "view_dispatcher", name="carol").get(url).content.decode()
    assert 'id="dispatchers"' in html and "secret-host" in html


@override_settings(AUTHENTICATION_BACKENDS=BACKENDS)
def test_an_object_level_backend_is_asked_with_the_run(client, django_user_model):
    granted, other = ready_run(), ready_run()
    GRANTS.add(("bob", "pgbus_workflows.pause_workflowrun", granted.record.pk))
    try:
        login(client, django_user_model, *VIEW)
        assert "pgbus-op-pause" in run_page_html(client, granted)
        assert "pgbus-op-pause" not in run_page_html(client, other)
        assert client.post(operation_url(other, "pause"), {"reason": "x"}).status_code == 403
        response = client.post(operation_url(granted, "pause"), {"reason": "only this one"})
        assert response.status_code == 302
        assert granted.reload().status == "paused" and other.reload().status == "ready"
    finally:
        GRANTS.clear()


@pytest.fixture
def pause_refused_for():
    """Override the registered admin's ``has_pause_permission`` as a project might: no pausing one run."""
    model_admin = admin.site.get_model_admin(WorkflowRun)
    blocked: set[int] = set()

    def has_pause_permission(request: Any, obj: Any = None) -> bool:
        return request.user.has_perm("pgbus_workflows.pause_workflowrun") and (obj is None or obj.pk not in blocked)

    model_admin.has_pause_permission = has_pause_permission
    yield blocked
    del model_admin.has_pause_permission


def test_one_override_of_has_pause_permission_governs_buttons_forms_and_bulk_actions(
    client, django_user_model, pause_refused_for
):
    allowed, blocked = ready_run(), ready_run()
    pause_refused_for.add(blocked.record.pk)
    login(client, django_user_model, *VIEW, "pause_workflowrun")

    assert "pgbus-op-pause" in run_page_html(client, allowed)
    assert "pgbus-op-pause" not in run_page_html(client, blocked)
    assert client.get(operation_url(blocked, "pause")).status_code == 403

    data = {
        "action": "pause_runs",
        "index": "0",
        ACTION_CHECKBOX_NAME: [allowed.record.pk, blocked.record.pk],
        "post": "yes",
        "reason": "maintenance",
    }
    response = client.post(reverse("admin:pgbus_workflows_workflowrun_changelist"), data)
    ((_, text),) = messages_of(response)
    assert text == "1 paused; 1 unchanged: you may not pause it", text
    assert allowed.reload().status == "paused" and blocked.reload().status == "ready"
