"""The schedules in the admin: the list (next fire, cron in words, last run), the verbs, adding one.

Pause, resume and fire now are buttons on a schedule's page, each behind its permission,
asking for a reason that lands in the schedule's audit trail with the username.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse

from pgbus_workflows.models import ScheduleEvent, WorkflowRun, WorkflowSchedule
from pgbus_workflows.services import schedules as verbs
from pgbus_workflows.testing import tick_schedules
from tests.support import messages_of, run_page, staff_user
from tests.testapp.workflows import Ticked

pytestmark = pytest.mark.django_db

VIEW = ("view_workflowschedule", "view_workflowrun")
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def login(client: Any, django_user_model: Any, *codenames: str, name: str = "olga") -> Any:
    client.force_login(staff_user(django_user_model, name, *codenames))
    return client


def page(schedule: WorkflowSchedule) -> str:
    return reverse("admin:pgbus_workflows_workflowschedule_change", args=[schedule.pk])


def verb_url(schedule: WorkflowSchedule, verb: str) -> str:
    return reverse(f"admin:pgbus_workflows_workflowschedule_{verb}", args=[schedule.pk])


def changelist() -> str:
    return reverse("admin:pgbus_workflows_workflowschedule_changelist")


def test_the_list_shows_next_fire_times_the_cron_in_words_and_the_last_run_with_its_status(client, django_user_model):
    nightly = Ticked.add_schedule(cron="30 2 * * *", timezone="Europe/Paris", name="nightly")
    minutely = Ticked.add_schedule(every=60, start_at=T0, name="minutely")
    [wf] = tick_schedules(now=T0 + timedelta(minutes=1))
    assert wf.record.schedule_id == minutely.pk

    html = login(client, django_user_model, *VIEW).get(changelist()).content.decode()

    assert "At 02:30 every day (Europe/Paris)" in html
    assert "Every minute" in html
    nightly.refresh_from_db()
    assert nightly.next_fire_at.strftime("%Y-%m-%d %H:%M:%S UTC") in html
    assert run_page(wf) in html and "2026-06-01 12:01:00" in html and "pgbus-s-ready" in html
    assert "2026-06-01 12:02:00 UTC (due " in html  # a tick no leader fired yet says so


def test_a_schedule_page_shows_its_buttons_trail_and_runs_and_a_run_page_links_back(client, django_user_model):
    schedule = Ticked.add_schedule(every=60, start_at=T0, name="minutely", actor="alice")
    [wf] = tick_schedules(now=T0 + timedelta(minutes=1))
    login(client, django_user_model, *VIEW, "pause_workflowschedule", "fire_workflowschedule")

    html = client.get(page(schedule)).content.decode()

    assert verb_url(schedule, "pause") in html and verb_url(schedule, "fire_now") in html
    assert verb_url(schedule, "resume") not in html  # not paused
    assert 'id="schedule-events"' in html and "alice" in html
    runs = client.get(reverse("admin:pgbus_workflows_workflowrun_changelist") + f"?schedule__id__exact={schedule.pk}")
    assert runs.status_code == 200 and str(wf.workflow_id)[:8] in runs.content.decode()
    assert page(schedule) in client.get(run_page(wf)).content.decode()


def test_pause_resume_and_fire_now_are_audited_with_the_username_and_reason(client, django_user_model):
    schedule = Ticked.add_schedule(every=60, name="minutely")
    login(client, django_user_model, *VIEW, "pause_workflowschedule", "fire_workflowschedule")

    assert client.get(verb_url(schedule, "pause")).status_code == 200  # the reason form
    response = client.post(verb_url(schedule, "pause"), {"reason": "db maintenance"})
    assert response.status_code == 302
    assert WorkflowSchedule.objects.get(pk=schedule.pk).paused
    assert verb_url(schedule, "resume") in client.get(page(schedule)).content.decode()
    client.post(verb_url(schedule, "resume"), {"reason": "done"})
    response = client.post(verb_url(schedule, "fire_now"), {"reason": "catch up by hand"}, follow=True)

    [run] = WorkflowRun.objects.filter(schedule=schedule)
    assert any("fired" in text for _, text in messages_of(response))
    trail = [(e.kind, e.actor, e.reason, e.run_id) for e in schedule.events.exclude(kind="created").order_by("pk")]
    assert trail == [
        ("paused", "olga", "db maintenance", None),
        ("resumed", "olga", "done", None),
        ("fired_now", "olga", "catch up by hand", run.pk),
    ]
    response = client.post(verb_url(schedule, "fire_now"), {"reason": "again"}, follow=True)
    assert any("overlap is 'skip'" in text for _, text in messages_of(response))  # refused, said, nothing started
    assert WorkflowRun.objects.filter(schedule=schedule).count() == 1


def test_without_its_permission_a_verb_is_refused_and_changes_nothing(client, django_user_model):
    schedule = Ticked.add_schedule(every=60, name="minutely")
    login(client, django_user_model, *VIEW, "pause_workflowschedule")

    assert verb_url(schedule, "fire_now") not in client.get(page(schedule)).content.decode()
    assert client.post(verb_url(schedule, "fire_now"), {"reason": "x"}).status_code == 403
    login(client, django_user_model, *VIEW, "fire_workflowschedule", name="pete")
    assert client.post(verb_url(schedule, "pause"), {"reason": "x"}).status_code == 403
    login(client, django_user_model, "pause_workflowschedule", name="nina")  # no view permission
    assert client.post(verb_url(schedule, "pause"), {"reason": "x"}).status_code == 403

    assert not WorkflowRun.objects.exists()
    assert not WorkflowSchedule.objects.get(pk=schedule.pk).paused
    assert list(ScheduleEvent.objects.values_list("kind", flat=True)) == ["created"]


def test_a_verb_the_state_refuses_is_a_message_and_a_missing_reason_a_form_error(client, django_user_model):
    schedule = Ticked.add_schedule(every=60, name="minutely")
    verbs.pause(schedule.pk, actor="alice")
    login(client, django_user_model, *VIEW, "pause_workflowschedule")

    response = client.post(verb_url(schedule, "pause"), {"reason": "twice"}, follow=True)
    assert any("already paused" in text for _, text in messages_of(response))
    response = client.post(verb_url(schedule, "resume"), {"reason": ""})
    assert response.status_code == 200 and "This field is required" in response.content.decode()
    assert WorkflowSchedule.objects.get(pk=schedule.pk).paused


def add_form(**values: Any) -> dict[str, Any]:
    data = {
        "workflow_class": "ticked",
        "name": "",
        "cron": "",
        "every_seconds": "",
        "timezone": "UTC",
        "arguments": "{}",
        "overlap": "skip",
        "catchup": "latest",
        "jitter_seconds": "",
    }
    return {**data, **values}


def test_adding_a_schedule_in_the_admin_goes_through_add_schedule_and_bad_input_is_a_form_error(
    client, django_user_model
):
    login(client, django_user_model, *VIEW, "add_workflowschedule", "add_workflowrun")
    add = reverse("admin:pgbus_workflows_workflowschedule_add")

    bad = client.post(add, add_form(cron="0 25 * * *"))
    assert bad.status_code == 200 and "is not valid: Bad hour" in bad.content.decode()
    bad = client.post(add, add_form(cron="0 3 * * *", timezone="Mars/Olympus"))
    assert "Unknown time zone" in bad.content.decode()
    bad = client.post(add, add_form())
    assert "exactly one of cron= and every=" in bad.content.decode()
    assert not WorkflowSchedule.objects.exists()

    response = client.post(add, add_form(cron="0 3 * * 1", timezone="Europe/Paris", arguments='{"kind": "weekly"}'))
    assert response.status_code == 302, response.content.decode()[:2000]
    schedule = WorkflowSchedule.objects.get()
    assert (schedule.name, schedule.cron, schedule.arguments, schedule.declared) == (
        "cron 0 3 * * 1",
        "0 3 * * 1",
        {"kind": "weekly"},
        False,
    )
    assert schedule.next_fire_at is not None and schedule.events.get().actor == "olga"
    response = client.post(add, add_form(cron="0 3 * * 1"), follow=True)
    assert any("already has a schedule named" in text for _, text in messages_of(response))
    assert WorkflowSchedule.objects.count() == 1


def test_a_declared_schedule_cannot_be_deleted_in_the_admin_one_added_at_run_time_can(client, django_user_model):
    tick_schedules(now=T0)  # syncs YearlyReport's declared schedules
    declared = WorkflowSchedule.objects.filter(declared=True).first()
    added = Ticked.add_schedule(every=60, name="minutely")
    login(client, django_user_model, *VIEW, "delete_workflowschedule")
    delete = "admin:pgbus_workflows_workflowschedule_delete"

    assert client.post(reverse(delete, args=[declared.pk]), {"post": "yes"}).status_code == 403
    assert client.post(reverse(delete, args=[added.pk]), {"post": "yes"}).status_code == 302
    assert list(WorkflowSchedule.objects.filter(pk__in=[declared.pk, added.pk])) == [declared]
