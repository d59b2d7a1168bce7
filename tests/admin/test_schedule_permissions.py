"""Who may add and fire schedules, and bad input at the schedule admin and CLI.

Adding a schedule starts runs on a clock, so it needs the permission to start runs too; firing
a ``cancel_previous`` schedule by hand needs the permission to cancel runs, and the cancelled
run's event names the operator and their reason. Bad ids and huge intervals are clear errors.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse

from pgbus_workflows.models import WorkflowRun, WorkflowSchedule
from pgbus_workflows.services.firing import fire_due
from tests.admin.test_schedule_admin import add_form, changelist, page, verb_url
from tests.management.test_cli import refusal
from tests.support import staff_user
from tests.testapp.workflows import Ticked

pytestmark = pytest.mark.django_db

VIEW = ("view_workflowschedule", "view_workflowrun")
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
ADD = "admin:pgbus_workflows_workflowschedule_add"


def login(client: Any, django_user_model: Any, *codenames: str, name: str = "olga") -> Any:
    client.force_login(staff_user(django_user_model, name, *codenames))
    return client


def test_adding_a_schedule_needs_the_permission_to_start_runs_too(client, django_user_model):
    login(client, django_user_model, *VIEW, "add_workflowschedule")

    assert client.get(reverse(ADD)).status_code == 403
    assert client.post(reverse(ADD), add_form(every_seconds="1", arguments='{"any": "thing"}')).status_code == 403
    assert not WorkflowSchedule.objects.exists()
    assert 'href="/admin/pgbus_workflows/workflowschedule/add/"' not in client.get(changelist()).content.decode()

    login(client, django_user_model, *VIEW, "add_workflowschedule", "add_workflowrun", name="sam")
    assert client.post(reverse(ADD), add_form(every_seconds="60")).status_code == 302
    assert WorkflowSchedule.objects.get().events.get().actor == "sam"


@pytest.mark.parametrize("field", ["every_seconds", "jitter_seconds"])
def test_a_huge_interval_or_jitter_in_the_add_form_is_a_form_error(client, django_user_model, field):
    login(client, django_user_model, *VIEW, "add_workflowschedule", "add_workflowrun")
    values = {"every_seconds": "60", field: "9" * 30}

    response = client.post(reverse(ADD), add_form(**values))

    assert response.status_code == 200
    assert "Ensure this value is less than or equal to 316224000" in response.content.decode()
    assert not WorkflowSchedule.objects.exists()


def test_fire_now_on_a_cancel_previous_schedule_needs_the_cancel_permission(client, django_user_model):
    schedule = Ticked.add_schedule(every=MINUTE, start_at=T0, name="replacing", overlap="cancel_previous")
    [previous] = fire_due(T0 + MINUTE)
    login(client, django_user_model, *VIEW, "fire_workflowschedule")

    assert verb_url(schedule, "fire_now") not in client.get(page(schedule)).content.decode()
    assert client.post(verb_url(schedule, "fire_now"), {"reason": "now"}).status_code == 403
    assert previous.reload().status == "ready" and WorkflowRun.objects.count() == 1

    login(client, django_user_model, *VIEW, "fire_workflowschedule", "cancel_workflowrun", name="carla")
    assert verb_url(schedule, "fire_now") in client.get(page(schedule)).content.decode()
    assert client.post(verb_url(schedule, "fire_now"), {"reason": "the data was late"}).status_code == 302

    assert previous.reload().status == "cancelled"
    cancelled = previous.events.get(kind="cancelled")
    assert (cancelled.actor, cancelled.reason) == ("carla", "the data was late")
    trail = schedule.events.get(kind="previous_cancelled")
    assert trail.actor == "carla" and trail.run_id == previous.record.pk
    assert WorkflowRun.objects.filter(schedule=schedule, status="ready").count() == 1


def test_fire_now_on_another_overlap_needs_only_the_fire_permission(client, django_user_model):
    schedule = Ticked.add_schedule(every=MINUTE, start_at=T0, name="allowing", overlap="allow")
    login(client, django_user_model, *VIEW, "fire_workflowschedule")

    assert client.post(verb_url(schedule, "fire_now"), {"reason": "now"}).status_code == 302
    assert WorkflowRun.objects.filter(schedule=schedule).count() == 1


def test_the_cli_asks_for_the_cancel_permission_to_fire_a_cancel_previous_schedule(django_user_model):
    schedule = Ticked.add_schedule(every=MINUTE, start_at=T0, name="replacing", overlap="cancel_previous")
    staff_user(django_user_model, "fred", "view_workflowschedule", "fire_workflowschedule")

    message = refusal("schedules", "fire-now", str(schedule.pk), "--as-user", "fred")

    assert "pgbus_workflows.cancel_workflowrun (its overlap cancels the previous run)" in message
    assert not WorkflowRun.objects.exists()


@pytest.mark.parametrize("text", ["²", "١٢", "9" * 30])
def test_a_schedule_id_of_non_ascii_digits_or_too_many_digits_is_a_clear_refusal(text):
    Ticked.add_schedule(every=MINUTE, name="minutely")

    message = refusal("schedules", "pause", text)

    assert message.startswith(f"{text}: ")
    assert "is not a schedule" in message or "there is no schedule" in message
    assert not WorkflowSchedule.objects.filter(paused=True).exists()


def test_a_failing_schedule_has_a_badge_in_the_list_and_its_error_on_its_page(client, django_user_model):
    failing = Ticked.add_schedule(every=MINUTE, name="failing")
    WorkflowSchedule.objects.filter(pk=failing.pk).update(
        last_error="PayloadTooLarge: ticked arguments is 3012 bytes", last_error_at=T0
    )
    Ticked.add_schedule(every=MINUTE, name="fine")
    login(client, django_user_model, *VIEW)

    html = client.get(changelist()).content.decode()
    assert html.count("pgbus-s-failed") == 1 and "failing" in html
    assert "PayloadTooLarge: ticked arguments is 3012 bytes" in client.get(page(failing)).content.decode()
