"""The operator console (the Django admin), through Django's test client.

Every action is checked three ways: permitted (the run moves, an event records the admin
user and the reason), refused without its permission (403, nothing changed) and refused by
the run's state (a warning, nothing changed). Runs are real runs of the classes below,
driven through the real executor by the test helpers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.contrib.messages.constants import SUCCESS, WARNING
from django.contrib.staticfiles import finders
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pgbus_workflows import Workflow, step
from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import VIEW, messages_of, new_events, operation_url, run_page, snapshot, staff_user
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()


class Boom(Exception):
    """Raised on purpose by a step body."""


class AdminThree(Workflow):
    name = "admin_three"
    extra_signals = ["approved", "later_use", "unrelated", "unused"]

    @step
    def a(self):
        return {"a": 1, "note": "<b>not html</b>"}

    @step
    def b(self):
        pass

    @step
    def c(self):
        pass


class AdminLater(Workflow):
    """Its first step waits an hour: a ready run with a scheduled step in the future."""

    name = "admin_later"
    extra_signals = ["approved", "later_use", "unrelated", "unused"]

    @step(wait=timedelta(hours=1))
    def later(self):
        pass

    @step
    def done(self):
        pass


class AdminFlaky(Workflow):
    """Its first step fails on the first attempt: the run pauses on an error."""

    name = "admin_flaky"
    extra_signals = ["approved", "later_use", "unrelated", "unused"]

    @step
    def boom(self):
        if self.attempt == 1:
            raise Boom("first attempt fails")

    @step
    def after(self):
        pass


class AdminWaits(Workflow):
    """Its first step waits for the "approved" signal."""

    name = "admin_waits"

    @step(wait_for="approved")
    def approve(self):
        return self.received_signal.payload

    @step
    def after(self):
        pass


# -- runs in given states ------------------------------------------------------------------------


def ready_run(**arguments: Any) -> Workflow:
    return AdminLater.start(Order.objects.create(), **arguments)


def due_run() -> Workflow:
    return AdminThree.start(Order.objects.create())


def paused_run() -> Workflow:
    wf = ready_run()
    wf.pause(actor="someone", reason="hold on")
    return wf


def failed_run() -> Workflow:
    wf = AdminFlaky.start(Order.objects.create())
    helpers.perform_next_step(wf)
    assert wf.status == "paused"
    return wf


def ready_flaky_run() -> Workflow:
    return AdminFlaky.start(Order.objects.create())


def finished_run() -> Workflow:
    wf = due_run()
    helpers.speedrun_workflow(wf)
    assert wf.status == "finished"
    return wf


def waiting_run() -> Workflow:
    wf = AdminWaits.start(Order.objects.create())
    helpers.perform_next_step(wf)
    assert wf.status == "waiting"
    return wf


# -- users ---------------------------------------------------------------------------------------

OPERATE = ("pause", "cancel", "rerun", "run_now", "skip", "signal")


@pytest.fixture
def operator_client(client: Any, django_user_model: Any) -> Any:
    """A staff user with view permission and every operation."""
    client.force_login(staff_user(django_user_model, "alice", *VIEW, *(f"{p}_workflowrun" for p in OPERATE)))
    return client


@pytest.fixture
def viewer_client(client: Any, django_user_model: Any) -> Any:
    """A staff user who may only look."""
    client.force_login(staff_user(django_user_model, "victor", *VIEW))
    return client


def client_without(client: Any, django_user_model: Any, permission: str) -> Any:
    """A staff user with every operation but ``permission``."""
    others = [f"{p}_workflowrun" for p in OPERATE if p != permission]
    client.force_login(staff_user(django_user_model, "mallory", *VIEW, *others))
    return client


# -- urls ----------------------------------------------------------------------------------------


def changelist() -> str:
    return reverse("admin:pgbus_workflows_workflowrun_changelist")


def dashboard() -> str:
    return reverse("admin:pgbus_workflows_workflowrun_dashboard")


# -- the runs changelist ---------------------------------------------------------------------------


def test_changelist_shows_class_subject_status_step_attempt_and_age(operator_client):
    failed, ready, finished = failed_run(), ready_run(), finished_run()
    response = operator_client.get(changelist())
    assert response.status_code == 200
    html = response.content.decode()
    for wf in (failed, ready, finished):
        assert str(wf.workflow_id)[:8] in html
    assert "admin_flaky" in html and "admin_later" in html and "admin_three" in html
    assert '<span class="pgbus-badge pgbus-s-paused">paused</span>' in html
    assert '<span class="pgbus-badge pgbus-s-finished">finished</span>' in html
    assert f"order {failed.record.subject_id}" in html  # Order is not in the admin: no link
    assert '<td class="field-current_step">boom</td>' in html
    assert '<td class="field-attempt">1</td>' in html
    assert 'class="field-age"' in html
    assert reverse("admin:pgbus_workflows_workflowrun_dashboard") in html


def test_subject_links_to_its_admin_page_when_its_model_is_registered(operator_client, django_user_model):
    bob = django_user_model.objects.create_user(username="bob")
    wf = AdminThree.start(bob)
    html = operator_client.get(changelist()).content.decode()
    assert f'<a href="{reverse("admin:auth_user_change", args=[bob.pk])}">user {bob.pk}</a>' in html
    html = operator_client.get(run_page(wf)).content.decode()
    assert reverse("admin:auth_user_change", args=[bob.pk]) in html


def shown_runs(response: Any) -> set[int]:
    return {run.pk for run in response.context["cl"].result_list}


def test_changelist_filters_by_class_status_and_stuck_reason(operator_client):
    failed, held, ready, finished = failed_run(), paused_run(), ready_run(), finished_run()
    get = operator_client.get
    assert shown_runs(get(changelist(), {"workflow_class": "admin_flaky"})) == {failed.record.pk}
    assert shown_runs(get(changelist(), {"status": "paused"})) == {failed.record.pk, held.record.pk}
    assert shown_runs(get(changelist(), {"status": "paused", "workflow_class": "admin_later"})) == {held.record.pk}
    # Only the run an error paused is stuck; the one an operator paused is not.
    assert shown_runs(get(changelist(), {"stuck": "paused_on_error"})) == {failed.record.pk}
    assert shown_runs(get(changelist(), {"stuck": "stalled"})) == set()
    assert shown_runs(get(changelist())) == {failed.record.pk, held.record.pk, ready.record.pk, finished.record.pk}
    # An unknown reason is a bad lookup: Django's changelist answers with its ?e=1 redirect.
    response = get(changelist(), {"stuck": "bogus"})
    assert response.status_code == 302 and response["Location"].endswith("?e=1")


def test_filter_sidebar_lists_classes_statuses_and_stuck_reasons(operator_client):
    failed_run()
    html = operator_client.get(changelist()).content.decode()
    for link in ("?workflow_class=admin_flaky", "?workflow_class=admin_waits", "?status=paused", "?stuck=overdue"):
        assert link in html


def test_changelist_searches_workflow_id_subject_id_and_idempotency_key(operator_client):
    first = AdminThree.start(Order.objects.create(), idempotency_key="invoice-2024-77")
    second = due_run()
    get = operator_client.get
    assert shown_runs(get(changelist(), {"q": str(first.workflow_id)})) == {first.record.pk}
    assert shown_runs(get(changelist(), {"q": str(second.workflow_id)[:13]})) == {second.record.pk}
    assert shown_runs(get(changelist(), {"q": second.record.subject_id})) == {second.record.pk}
    assert shown_runs(get(changelist(), {"q": "invoice-2024-77"})) == {first.record.pk}
    # Keys and subject ids are matched whole (an index serves that; a substring reads every run).
    assert shown_runs(get(changelist(), {"q": "invoice-2024"})) == set()


def test_changelist_has_no_date_hierarchy(operator_client):
    # Its year links would read every run's created_at (MIN, MAX, then DISTINCT dates).
    due_run()
    response = operator_client.get(changelist())
    assert response.context["cl"].date_hierarchy is None
    assert 'class="toplinks"' not in response.content.decode()


def test_changelist_query_count_does_not_grow_with_the_page(
    operator_client, django_user_model, django_assert_max_num_queries
):
    def start_runs(n: int) -> None:
        for i in range(n):
            subject = django_user_model.objects.create_user(username=f"u{WorkflowRun.objects.count()}-{i}")
            wf = AdminFlaky.start(subject) if i % 2 else AdminThree.start(subject, n=i)
            if i % 3 == 0:
                helpers.perform_next_step(wf)

    def count_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            response = operator_client.get(changelist())
        assert response.status_code == 200
        return len(queries)

    start_runs(5)
    with_5 = count_queries()
    start_runs(45)
    assert WorkflowRun.objects.count() == 50
    with_50 = count_queries()
    assert with_50 == with_5
    with django_assert_max_num_queries(with_5):
        operator_client.get(changelist())


# -- the run page ----------------------------------------------------------------------------------


def test_run_page_shows_header_timeline_events_and_signals(operator_client):
    wf = AdminFlaky.start(Order.objects.create(), color="red", sizes=[1, 2])
    helpers.perform_next_step(wf)  # fails: paused on error
    wf.signal("unrelated", payload={"x": 1}, idempotency_key="k-1", actor="bob")
    wf.resume(actor="carol", reason="fixed the bug")
    helpers.perform_next_step(wf)  # succeeds
    response = operator_client.get(run_page(wf))
    assert response.status_code == 200
    html = response.content.decode()
    assert "admin_flaky" in html and f"order {wf.record.subject_id}" in html
    assert '<pre class="pgbus-json">{\n  &quot;color&quot;: &quot;red&quot;,' in html
    assert 'id="timeline"' in html and html.count('href="/admin/pgbus_workflows/workflowstep/') >= 3
    assert '<span class="pgbus-error">tests.admin.test_admin.Boom</span>: first attempt fails' in html or (
        '<span class="pgbus-error">Boom</span>: first attempt fails' in html
    )
    assert "<details><summary>Traceback</summary>" in html and "raise Boom" in html
    assert '<tr class="pgbus-event pgbus-event-resumed">' in html
    assert "carol" in html and "fixed the bug" in html
    assert 'id="signals"' in html and "unrelated" in html and "k-1" in html
    assert '<span class="pgbus-badge pgbus-s-pending">pending</span>' in html
    for name in ("workflowstep", "workflowevent", "workflowsignal"):
        assert f"/admin/pgbus_workflows/{name}/?run__id__exact={wf.record.pk}" in html


def test_run_page_escapes_step_output(operator_client):
    wf = finished_run()
    html = operator_client.get(run_page(wf)).content.decode()
    assert "&lt;b&gt;not html&lt;/b&gt;" in html and "<b>not html</b>" not in html


@pytest.mark.parametrize(
    ("make", "shown", "hidden"),
    [
        (ready_run, {"pause", "cancel", "run_now", "skip", "signal"}, {"resume", "resume_at", "rerun"}),
        (due_run, {"pause", "cancel", "skip", "signal"}, {"run_now", "resume", "rerun"}),
        (failed_run, {"resume", "resume_at", "cancel", "skip", "signal"}, {"pause", "rerun", "run_now"}),
        (waiting_run, {"pause", "cancel", "run_now", "signal", "skip"}, {"resume", "rerun"}),
        (finished_run, {"rerun"}, {"pause", "resume", "resume_at", "cancel", "run_now", "skip", "signal"}),
    ],
)
def test_run_page_shows_only_the_buttons_its_state_allows(operator_client, make, shown, hidden):
    wf = make()
    html = operator_client.get(run_page(wf)).content.decode()
    for verb in shown:
        assert f'href="{operation_url(wf, verb)}"' in html, verb
    for verb in hidden:
        assert f'href="{operation_url(wf, verb)}"' not in html, verb


def test_view_only_staff_sees_no_buttons_and_no_actions(viewer_client):
    wf = ready_run()
    html = viewer_client.get(run_page(wf)).content.decode()
    assert "pgbus-op-" not in html
    assert 'id="timeline"' in html
    response = viewer_client.get(changelist())
    assert response.status_code == 200
    assert 'name="action"' not in response.content.decode()


def test_buttons_follow_each_permission(client, django_user_model):
    wf = ready_run()
    client.force_login(staff_user(django_user_model, "canceller", *VIEW, "cancel_workflowrun"))
    html = client.get(run_page(wf)).content.decode()
    assert f'href="{operation_url(wf, "cancel")}"' in html
    assert f'href="{operation_url(wf, "pause")}"' not in html


def test_nothing_can_be_added_edited_or_deleted(operator_client, admin_client):
    wf = ready_run()
    before = snapshot(wf)
    for c in (operator_client, admin_client):
        assert c.get(reverse("admin:pgbus_workflows_workflowrun_add")).status_code == 403
        assert c.post(run_page(wf), {"status": "finished", "current_step": "x"}).status_code == 403
        delete = reverse("admin:pgbus_workflows_workflowrun_delete", args=[wf.record.pk])
        assert c.post(delete, {"post": "yes"}).status_code == 403
        step = WorkflowStep.objects.filter(run_id=wf.record.pk).get()
        change_step = reverse("admin:pgbus_workflows_workflowstep_change", args=[step.pk])
        assert c.post(change_step, {"status": "completed"}).status_code == 403
    assert snapshot(wf) == before
    html = admin_client.get(run_page(wf)).content.decode()
    form = html.split('id="workflowrun_form"')[1].split("</form>")[0]
    assert "<textarea" not in form and "<select" not in form and 'type="text"' not in form
    assert 'name="_save"' not in form
    assert 'value="delete_selected"' not in admin_client.get(changelist()).content.decode()


# -- the operations on a run's page ----------------------------------------------------------------


@dataclass
class Case:
    verb: str
    permission: str
    allowed: Callable[[], Workflow]
    refused: Callable[[], Workflow]
    kind: str
    data: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.verb


CASES = [
    Case("pause", "pause", ready_run, finished_run, "paused"),
    Case("resume", "pause", paused_run, ready_run, "resumed"),
    Case("resume_at", "skip", failed_run, ready_flaky_run, "resumed_at", {"step": "after"}),
    Case("cancel", "cancel", ready_run, finished_run, "cancelled"),
    Case("rerun", "rerun", finished_run, ready_run, "rerun"),
    Case("run_now", "run_now", ready_run, due_run, "run_now"),
    Case("skip", "skip", ready_run, finished_run, "step_skipped"),
    Case(
        "signal", "signal", waiting_run, finished_run, "signal_received", {"name": "approved", "payload": '{"ok": 1}'}
    ),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_operation_form_asks_for_a_reason(operator_client, case):
    wf = case.allowed()
    before = snapshot(wf)
    response = operator_client.get(operation_url(wf, case.verb))
    assert response.status_code == 200
    assert 'name="reason"' in response.content.decode()
    response = operator_client.post(operation_url(wf, case.verb), {**case.data, "reason": ""})
    assert response.status_code == 200
    assert response.context["form"].errors["reason"]
    assert snapshot(wf) == before


@pytest.mark.parametrize("case", CASES, ids=str)
def test_operation_permitted_moves_the_run_and_records_who_and_why(operator_client, case):
    wf = case.allowed()
    before = snapshot(wf)
    response = operator_client.post(operation_url(wf, case.verb), {**case.data, "reason": "ticket 42"})
    assert response.status_code == 302
    assert [level for level, _ in messages_of(response)] == [SUCCESS]
    events = new_events(wf, before)
    matching = [e for e in events if e.kind == case.kind]
    assert len(matching) == 1, [e.kind for e in events]
    assert (matching[0].actor, matching[0].reason) == ("alice", "ticket 42")
    assert snapshot(wf) != before
    if case.verb == "rerun":
        new = WorkflowRun.objects.get(rerun_of=wf.workflow_id)
        assert response["Location"] == reverse("admin:pgbus_workflows_workflowrun_change", args=[new.pk])
    else:
        assert response["Location"] == run_page(wf)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_operation_without_its_permission_is_forbidden(client, django_user_model, case):
    wf = case.allowed()
    before = snapshot(wf)
    client = client_without(client, django_user_model, case.permission)
    assert client.get(operation_url(wf, case.verb)).status_code == 403
    assert client.post(operation_url(wf, case.verb), {**case.data, "reason": "sneaky"}).status_code == 403
    assert snapshot(wf) == before


@pytest.mark.parametrize("case", CASES, ids=str)
def test_operation_refused_by_the_runs_state_warns_and_changes_nothing(operator_client, case):
    wf = case.refused()
    before = snapshot(wf)
    response = operator_client.post(operation_url(wf, case.verb), {**case.data, "reason": "try anyway"})
    assert response.status_code == 302 and response["Location"] == run_page(wf)
    ((level, text),) = messages_of(response)
    assert level == WARNING and text.startswith("Cannot")
    assert snapshot(wf) == before


def test_operation_on_a_missing_run_redirects_with_a_warning(operator_client):
    url = reverse("admin:pgbus_workflows_workflowrun_pause", args=[987654])
    response = operator_client.post(url, {"reason": "x"})
    assert response.status_code == 302
    ((level, text),) = messages_of(response)
    assert level == WARNING and "987654" in text


def test_resume_at_lists_the_class_steps_and_refuses_another(operator_client):
    wf = failed_run()
    response = operator_client.get(operation_url(wf, "resume_at"))
    assert [value for value, _ in response.context["form"].fields["step"].choices] == ["boom", "after"]
    before = snapshot(wf)
    response = operator_client.post(operation_url(wf, "resume_at"), {"step": "nope", "reason": "x"})
    assert response.status_code == 200 and response.context["form"].errors["step"]
    assert snapshot(wf) == before
    operator_client.post(operation_url(wf, "resume_at"), {"step": "after", "reason": "skip the broken one"})
    active = WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled")
    assert active.step_name == "after"
    assert wf.reload().status == "ready"


def test_signal_wakes_the_waiting_step_with_its_payload(operator_client):
    wf = waiting_run()
    data = {"name": "approved", "payload": '{"by": "alice", "amount": 42}', "idempotency_key": "evt-1", "reason": "ok"}
    operator_client.post(operation_url(wf, "signal"), data)
    signal = WorkflowSignal.objects.get(run_id=wf.record.pk)
    assert (signal.name, signal.payload, signal.idempotency_key) == ("approved", {"by": "alice", "amount": 42}, "evt-1")
    assert (signal.actor, signal.reason, signal.status) == ("alice", "ok", "consumed")
    assert wf.reload().status == "ready"


def test_signal_with_bad_json_is_a_form_error_and_changes_nothing(operator_client):
    wf = waiting_run()
    before = snapshot(wf)
    response = operator_client.post(
        operation_url(wf, "signal"), {"name": "approved", "payload": "{oops", "reason": "x"}
    )
    assert response.status_code == 200
    assert "This is not valid JSON" in response.context["form"].errors["payload"][0]
    assert snapshot(wf) == before


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"note": "nul\\u0000"}', "NUL character"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_signal_with_a_payload_postgresql_cannot_store_is_a_form_error_not_a_500(operator_client, payload, message):
    wf = waiting_run()
    before = snapshot(wf)
    response = operator_client.post(
        operation_url(wf, "signal"), {"name": "approved", "payload": payload, "reason": "x"}
    )
    assert response.status_code == 200
    assert message in response.context["form"].errors["payload"][0]
    assert snapshot(wf) == before


def test_signal_with_a_repeated_idempotency_key_changes_nothing(operator_client):
    wf = ready_run()
    data = {"name": "later_use", "payload": "", "idempotency_key": "evt-9", "reason": "x"}
    operator_client.post(operation_url(wf, "signal"), data, follow=True)  # shows (consumes) its message
    (signal,) = WorkflowSignal.objects.filter(run_id=wf.record.pk)
    assert signal.payload == {}
    before = snapshot(wf)
    response = operator_client.post(operation_url(wf, "signal"), data)
    ((level, text),) = messages_of(response)
    assert level == WARNING and "already delivered" in text
    assert snapshot(wf) == before


# -- bulk actions on the changelist -----------------------------------------------------------------

BULK = [case for case in CASES if case.verb not in ("resume_at", "signal")]


def bulk_post(client: Any, case: Case, runs: list[Workflow], **extra: str) -> Any:
    data = {"action": f"{case.verb}_runs", "index": "0", ACTION_CHECKBOX_NAME: [wf.record.pk for wf in runs], **extra}
    return client.post(changelist(), data)


@pytest.mark.parametrize("case", BULK, ids=str)
def test_bulk_action_confirms_then_reports_counts(operator_client, case):
    movable = [case.allowed(), case.allowed()]
    stuck = case.refused()
    befores = {wf.record.pk: snapshot(wf) for wf in [*movable, stuck]}

    confirmation = bulk_post(operator_client, case, [*movable, stuck])
    assert confirmation.status_code == 200
    html = confirmation.content.decode()
    assert 'name="reason"' in html and 'name="post" value="yes"' in html
    assert all(str(wf.workflow_id) in html for wf in [*movable, stuck])
    assert all(snapshot(wf) == befores[wf.record.pk] for wf in [*movable, stuck])

    response = bulk_post(operator_client, case, [*movable, stuck], post="yes", reason="")
    assert response.status_code == 200 and response.context["form"].errors["reason"]

    response = bulk_post(operator_client, case, [*movable, stuck], post="yes", reason="incident 7")
    assert response.status_code == 302
    ((level, text),) = messages_of(response)
    assert level == WARNING
    assert text.startswith("2 ") and "; 1 unchanged: Cannot" in text, text
    for wf in movable:
        (event,) = [e for e in new_events(wf, befores[wf.record.pk]) if e.kind == case.kind]
        assert (event.actor, event.reason) == ("alice", "incident 7")
    assert snapshot(stuck)[:4] == befores[stuck.record.pk][:4]  # a rerun adds runs, but none for it


def test_bulk_pause_message_reads_like_a_sentence(operator_client):
    runs = [ready_run(), ready_run(), ready_run(), finished_run()]
    response = bulk_post(operator_client, BULK[0], runs, post="yes", reason="maintenance")
    ((level, text),) = messages_of(response)
    operator_client.get(changelist())  # shows (consumes) the message
    assert level == WARNING
    assert text == "3 paused; 1 unchanged: Cannot pause a finished workflow"
    response = bulk_post(operator_client, BULK[1], runs[:3], post="yes", reason="done")
    assert messages_of(response) == [(SUCCESS, "3 resumed")]


def test_bulk_action_on_all_filtered_runs(operator_client):
    runs = [ready_run(), ready_run()]
    other = due_run()
    data = {"action": "pause_runs", "index": "0", "select_across": "1", ACTION_CHECKBOX_NAME: [runs[0].record.pk]}
    url = changelist() + "?workflow_class=admin_later"
    confirmation = operator_client.post(url, data)
    assert 'name="select_across" value="1"' in confirmation.content.decode()
    operator_client.post(url, {**data, "post": "yes", "reason": "all of them"})
    assert [wf.reload().status for wf in runs] == ["paused", "paused"]
    assert other.reload().status == "ready"


@pytest.mark.parametrize("case", BULK, ids=str)
def test_bulk_action_without_its_permission_is_forbidden(client, django_user_model, case):
    wf = case.allowed()
    before = snapshot(wf)
    client = client_without(client, django_user_model, case.permission)
    assert client.get(changelist()).status_code == 200
    assert f'value="{case.verb}_runs"' not in client.get(changelist()).content.decode()
    assert bulk_post(client, case, [wf]).status_code == 403
    assert bulk_post(client, case, [wf], post="yes", reason="sneaky").status_code == 403
    assert snapshot(wf) == before


def test_bulk_actions_are_listed_for_an_operator(operator_client):
    ready_run()  # the changelist offers actions only when it lists runs
    html = operator_client.get(changelist()).content.decode()
    for case in BULK:
        assert f'value="{case.verb}_runs"' in html
    assert 'value="delete_selected"' not in html


# -- the dashboard ---------------------------------------------------------------------------------


def test_dashboard_counts_runs_by_class_status_and_stuck_reason(operator_client):
    failed_run(), failed_run(), paused_run(), ready_run(), finished_run()
    Dispatcher.objects.create(name="host-1:123", hostname="host-1", pid=123, queues=["workflows"])
    Dispatcher.objects.create(
        name="host-2:9", hostname="host-2", pid=9, heartbeat_at=timezone.now() - timedelta(minutes=10)
    )
    response = operator_client.get(dashboard())
    assert response.status_code == 200
    html = response.content.decode()
    rows = {row["workflow_class"]: row for row in response.context["rows"]}
    flaky = {cell["key"]: cell["count"] for cell in rows["admin_flaky"]["statuses"]}
    assert flaky["paused"] == 2 and flaky["ready"] == 0
    stuck = {cell["key"]: cell["count"] for cell in rows["admin_flaky"]["stuck"]}
    assert stuck["paused_on_error"] == 2
    assert {cell["key"]: cell["count"] for cell in rows["admin_later"]["stuck"]}["paused_on_error"] == 0
    assert '<a href="/admin/pgbus_workflows/workflowrun/?workflow_class=admin_flaky&amp;status=paused">2</a>' in html
    assert (
        '<a href="/admin/pgbus_workflows/workflowrun/?workflow_class=admin_flaky&amp;stuck=paused_on_error">2</a>'
        in (html)
    )
    assert '<a href="/admin/pgbus_workflows/workflowrun/?status=paused">3</a>' in html
    assert "<svg" in html and 'class="pgbus-bar pgbus-s-paused"' in html and "<script" not in html.split("<svg")[1]
    assert "host-1" in html and "host-2" in html and "silent" in html
    last_hour = {(c["key"], c["count"]) for c in response.context["recent_steps"]["totals"]}
    assert last_hour == {("completed", 3), ("failed", 2)}
    assert "/admin/pgbus_workflows/workflowstep/?finished_within=1h&amp;status__exact=failed" in html


def test_dashboard_links_lead_to_the_matching_runs(operator_client):
    failed, held = failed_run(), paused_run()
    response = operator_client.get(dashboard())
    rows = {row["workflow_class"]: row for row in response.context["rows"]}
    paused_flaky = next(c["url"] for c in rows["admin_flaky"]["statuses"] if c["key"] == "paused")
    assert shown_runs(operator_client.get(paused_flaky)) == {failed.record.pk}
    on_error = next(c["url"] for c in response.context["stuck_totals"] if c["key"] == "paused_on_error")
    assert shown_runs(operator_client.get(on_error)) == {failed.record.pk}
    all_paused = next(c["url"] for c in response.context["totals"] if c["key"] == "paused")
    assert shown_runs(operator_client.get(all_paused)) == {failed.record.pk, held.record.pk}
    failed_steps = next(c["url"] for c in response.context["recent_steps"]["totals"] if c["key"] == "failed")
    steps = operator_client.get(failed_steps).context["cl"].result_list
    assert [(s.run_id, s.status) for s in steps] == [(failed.record.pk, "failed")]


def test_dashboard_is_linked_from_the_app_index_and_needs_view_permission(operator_client, client, django_user_model):
    html = operator_client.get(reverse("admin:app_list", args=["pgbus_workflows"])).content.decode()
    assert f'href="{dashboard()}"' in html
    client.force_login(staff_user(django_user_model, "nobody"))
    assert client.get(dashboard()).status_code == 403


def test_dashboard_with_nothing_stored(operator_client):
    response = operator_client.get(dashboard())
    assert response.status_code == 200
    assert "No dispatcher is running." in response.content.decode()


# -- attempts, events, signals and dispatchers -----------------------------------------------------


def test_step_event_signal_and_dispatcher_admins_render_read_only(operator_client):
    wf = failed_run()
    wf.signal("later_use", payload={"k": [1, 2]}, actor="bob")
    Dispatcher.objects.create(name="host-1:1", hostname="host-1", pid=1)
    for model in ("workflowstep", "workflowevent", "workflowsignal", "dispatcher"):
        url = reverse(f"admin:pgbus_workflows_{model}_changelist")
        response = operator_client.get(url)
        assert response.status_code == 200, model
        html = response.content.decode()
        assert 'name="action"' not in html and "addlink" not in html, model
    step = WorkflowStep.objects.get(run_id=wf.record.pk)
    html = operator_client.get(reverse("admin:pgbus_workflows_workflowstep_change", args=[step.pk])).content.decode()
    assert "first attempt fails" in html and "raise Boom" in html and run_page(wf) in html
    event = WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="signal_received").get()
    html = operator_client.get(reverse("admin:pgbus_workflows_workflowevent_change", args=[event.pk])).content.decode()
    assert "bob" in html and "&quot;signal&quot;: &quot;later_use&quot;" in html
    signal = WorkflowSignal.objects.get(run_id=wf.record.pk)
    html = operator_client.get(
        reverse("admin:pgbus_workflows_workflowsignal_change", args=[signal.pk])
    ).content.decode()
    assert "&quot;k&quot;: [" in html and 'name="_save"' not in html


def test_run_page_links_to_its_attempts_events_and_signals(operator_client):
    wf, other = failed_run(), finished_run()
    html = operator_client.get(run_page(wf)).content.decode()
    for model, count in (("workflowstep", 1), ("workflowevent", None), ("workflowsignal", 0)):
        url = f"/admin/pgbus_workflows/{model}/?run__id__exact={wf.record.pk}"
        assert url in html
        rows = operator_client.get(url).context["cl"].result_list
        assert {row.run_id for row in rows} <= {wf.record.pk}
        if count is not None:
            assert len(rows) == count
    events = operator_client.get(f"/admin/pgbus_workflows/workflowevent/?run__id__exact={other.record.pk}")
    assert {e.kind for e in events.context["cl"].result_list} >= {"started"}


def test_step_admin_filters_by_class_and_recent_finish(operator_client):
    failed, finished = failed_run(), finished_run()
    url = reverse("admin:pgbus_workflows_workflowstep_changelist")
    rows = operator_client.get(url, {"workflow_class": "admin_flaky"}).context["cl"].result_list
    assert {s.run_id for s in rows} == {failed.record.pk}
    WorkflowStep.objects.filter(run_id=finished.record.pk).update(finished_at=timezone.now() - timedelta(hours=2))
    rows = operator_client.get(url, {"finished_within": "1h"}).context["cl"].result_list
    assert {s.run_id for s in rows} == {failed.record.pk}
    rows = operator_client.get(url, {"finished_within": "24h"}).context["cl"].result_list
    assert {s.run_id for s in rows} == {failed.record.pk, finished.record.pk}


def test_json_helpers_render_arguments_as_indented_json(operator_client):
    wf = AdminThree.start(None, nested={"b": [1, 2], "a": None})
    html = operator_client.get(run_page(wf)).content.decode()
    expected = json.dumps({"nested": {"a": None, "b": [1, 2]}}, indent=2, sort_keys=True)
    assert expected.replace('"', "&quot;") in html


def test_signal_over_the_payload_limit_is_a_form_error_and_changes_nothing(operator_client):
    wf = waiting_run()
    before = snapshot(wf)
    payload = json.dumps({"blob": "x" * 5000})  # the test settings allow 4096 bytes
    response = operator_client.post(
        operation_url(wf, "signal"), {"name": "approved", "payload": payload, "reason": "x"}
    )
    assert response.status_code == 200
    assert "MAX_PAYLOAD_SIZE" in response.context["form"].errors["payload"][0]
    assert snapshot(wf) == before


def test_rerun_page_links_back_to_the_original_run(operator_client):
    wf = finished_run()
    response = operator_client.post(operation_url(wf, "rerun"), {"reason": "again"}, follow=True)
    new = WorkflowRun.objects.get(rerun_of=wf.workflow_id)
    assert response.redirect_chain[-1][0] == reverse("admin:pgbus_workflows_workflowrun_change", args=[new.pk])
    html = response.content.decode()
    assert f'<a href="{run_page(wf)}">{wf.workflow_id}</a>' in html
    assert f"Rerun started as run {new.workflow_id}." in html


def test_run_page_shows_fan_out_progress_linked_to_its_read_only_jobs(operator_client, django_user_model):
    from pgbus_workflows.services.fanout import claim_due_jobs, execute_job
    from tests.testapp.workflows import Squares

    wf = Squares.start(count=3)
    helpers.perform_next_step(wf)  # opens the fan-out: three jobs
    for job in claim_due_jobs(2):
        execute_job(job)
    fan_out_step = WorkflowStep.objects.get(run=wf.record, step_name="compute")

    html = operator_client.get(run_page(wf)).content.decode()

    assert "fan-out: 2 done / 0 failed / 3 jobs" in html
    jobs_url = f"/admin/pgbus_workflows/fanoutjob/?step__id__exact={fan_out_step.pk}"
    assert jobs_url in html
    alice = django_user_model.objects.get(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="view_fanoutjob"))
    jobs_page = operator_client.get(jobs_url)
    assert jobs_page.status_code == 200
    assert jobs_page.content.decode().count('<td class="field-function">tests.testapp.jobs.square</td>') == 3
    assert operator_client.post("/admin/pgbus_workflows/fanoutjob/add/", {}).status_code == 403


def test_every_admin_page_links_the_stylesheet_through_media(operator_client):
    wf = waiting_run()
    pages = [
        run_page(wf),
        reverse("admin:pgbus_workflows_workflowrun_changelist"),
        dashboard(),
        operation_url(wf, "pause"),
        reverse("admin:pgbus_workflows_workflowstep_changelist"),
    ]
    for url in pages:
        html = operator_client.get(url).content.decode()
        assert 'href="/static/pgbus_workflows/admin.css"' in html, url
        assert "<style>" not in html, url
    response = operator_client.post(
        reverse("admin:pgbus_workflows_workflowrun_changelist"),
        {"action": "pause_runs", "_selected_action": [wf.record.pk]},
    )
    assert 'href="/static/pgbus_workflows/admin.css"' in response.content.decode()  # the bulk confirmation
    assert finders.find("pgbus_workflows/admin.css")
