"""The read tools through the SDK's client, on PostgreSQL: what they answer, their caps, their errors.

Payloads are shown here (``MCP_SHOW_PAYLOADS``) where a test reads them; redaction is
``test_responses.py``'s. A bad argument, a missing run, an unknown class: each a tool error
with a message, and the session goes on serving.
"""

from datetime import timedelta

import pytest
from django.test import override_settings

from pgbus_workflows.mcp.arguments import MAX_LIMIT, MAX_PAGE
from pgbus_workflows.models import WorkflowRun, WorkflowSchedule
from pgbus_workflows.services.stuck import STUCK_REASONS
from tests.management.test_cli import finished, paused_on_error, ready, waiting, wid
from tests.mcp.session import answer, answered, call_all, text, tool_error
from tests.support import VIEW, WITHHELD, events_of, staff_user
from tests.testapp.models import Order
from tests.testapp.workflows import Approval, Ticked

pytestmark = pytest.mark.django_db

SHOWN = override_settings(PGBUS_WORKFLOWS={"MCP_SHOW_PAYLOADS": True})


def ids(**arguments):
    return {row["workflow_id"] for row in answer("list_runs", arguments)["runs"]}


# -- list_runs -------------------------------------------------------------------------------------


def test_list_runs_gives_the_newest_runs_first_with_the_clis_fields():
    runs = [ready(Order.objects.create()), finished(), paused_on_error()]
    listed = answer("list_runs")
    assert [row["workflow_id"] for row in listed["runs"]] == [wid(wf) for wf in reversed(runs)]
    assert (listed["page"], listed["more"]) == (1, False)
    row = listed["runs"][0]
    assert (row["workflow_class"], row["status"], row["current_step"], row["attempt"]) == (
        "fails_first",
        "paused",
        "flaky",
        1,
    )
    assert listed["runs"][2]["subject"] == f"testapp.order:{runs[0].record.subject_id}"
    record = WorkflowRun.objects.get(pk=runs[2].record.pk)
    assert row["status_changed_at"] == record.status_changed_at.isoformat()


def test_list_runs_filters_by_class_status_stuck_reason_and_subject():
    first, second = Order.objects.create(), Order.objects.create()
    a, b, c, d = ready(first), paused_on_error(second), finished(), ready(second)

    assert ids() == {wid(a), wid(b), wid(c), wid(d)}
    assert ids(workflow_class=["three_steps"]) == {wid(a), wid(c), wid(d)}
    assert ids(workflow_class=["fails_first", "three_steps"], status=["finished"]) == {wid(c)}
    assert ids(status=["paused", "finished"]) == {wid(b), wid(c)}
    assert ids(stuck="paused_on_error") == {wid(b)}
    assert ids(stuck="stalled") == set()
    assert ids(subject=f"testapp.order:{second.pk}") == {wid(b), wid(d)}
    assert ids(subject="testapp.order", status=["ready"]) == {wid(a), wid(d)}


def test_list_runs_pages_through_the_newest_runs_and_says_when_more_match():
    runs = [ready() for _ in range(5)]
    newest = [wid(wf) for wf in reversed(runs)]
    pages = [answer("list_runs", {"limit": 2, "page": page}) for page in (1, 2, 3)]
    assert [[row["workflow_id"] for row in page["runs"]] for page in pages] == [newest[:2], newest[2:4], newest[4:]]
    assert [(page["page"], page["more"]) for page in pages] == [(1, True), (2, True), (3, False)]
    assert answer("list_runs", {"limit": 5})["more"] is False


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"limit": MAX_LIMIT + 1}, "limit\n  Input should be less than or equal to 100"),
        ({"limit": 0}, "limit\n  Input should be greater than or equal to 1"),
        ({"page": MAX_PAGE + 1}, "page\n  Input should be less than or equal to 10"),
        ({"status": ["stuck"]}, "status must be one of ready, performing, waiting, paused, finished, cancelled"),
        ({"stuck": "lost"}, f"stuck reason must be one of {', '.join(STUCK_REASONS)}; got 'lost'"),
        ({"workflow_class": [f"c{n}" for n in range(21)]}, "List should have at most 20 items"),
        ({"subject": "order"}, "subject: a subject is app_label.model:pk (shop.order:42) or app_label.model"),
        ({"limit": "many"}, "Input should be a valid integer"),
    ],
)
def test_list_runs_refuses_a_bad_argument_with_a_message_naming_it(arguments, message):
    assert message in tool_error("list_runs", arguments)


# -- show_run --------------------------------------------------------------------------------------


@SHOWN
def test_show_run_has_the_run_the_verbs_it_may_take_its_attempts_events_and_pending_signals():
    wf = paused_on_error(Order.objects.create())
    page = answer("show_run", {"workflow_id": wid(wf)[:8]})
    assert page["run"]["workflow_id"] == wid(wf)
    assert (page["run"]["workflow_class"], page["run"]["status"]) == ("fails_first", "paused")
    assert page["allowed_verbs"] == ["resume", "resume_at", "skip", "cancel", "fork"]
    assert [(a["step_name"], a["status"], a["error_class"]) for a in page["attempts"]] == [
        ("flaky", "failed", "RuntimeError")
    ]
    assert page["attempts"][0]["error_message"] == "the first attempt fails"
    assert [e["kind"] for e in page["events"]] == [e.kind for e in events_of(wf)]
    assert page["pending_signals"] == []

    signalled = Approval.start()
    signalled.signal("approved", {"amount": 42}, actor="webhook")
    page = answer("show_run", {"workflow_id": wid(signalled)})
    assert [(s["name"], s["payload"], s["actor"]) for s in page["pending_signals"]] == [
        ("approved", {"amount": 42}, "webhook")
    ]


def test_show_run_shows_the_latest_attempts_and_events_it_is_asked_for():
    wf = finished()
    page = answer("show_run", {"workflow_id": wid(wf), "attempts": 2, "events": 3})
    assert [a["step_name"] for a in page["attempts"]] == ["two", "three"]
    assert [e["kind"] for e in page["events"]] == [e.kind for e in events_of(wf)][-3:]
    assert (page["older_attempts_omitted"], page["older_events_omitted"]) == (True, True)
    assert "events\n  Input should be less than or equal to 100" in tool_error(
        "show_run", {"workflow_id": wid(wf), "events": 101}
    )


def test_show_run_of_a_missing_or_malformed_id_is_a_tool_error():
    assert tool_error("show_run", {"workflow_id": "0123456789abcdef0123456789abcdef"}) == (
        "Error executing tool show_run: No workflow run 0123456789abcdef0123456789abcdef"
    )
    assert tool_error("show_run", {"workflow_id": "nope"}) == (
        "Error executing tool show_run: 'nope' is not a workflow id (its 32 hex digits, or the first 8 or more)"
    )
    assert "workflow_id\n  Field required" in tool_error("show_run", {})


# -- stuck_runs, insights, list_schedules ----------------------------------------------------------


def test_stuck_runs_lists_each_reasons_runs_or_the_one_asked_for():
    paused = paused_on_error()
    ready()
    every = answer("stuck_runs")
    assert [group["stuck_reason"] for group in every["stuck"]] == list(STUCK_REASONS)
    found = {group["stuck_reason"]: [row["workflow_id"] for row in group["runs"]] for group in every["stuck"]}
    assert found == {reason: [wid(paused)] if reason == "paused_on_error" else [] for reason in STUCK_REASONS}

    one = answer("stuck_runs", {"reason": "paused_on_error", "workflow_class": ["three_steps"]})
    assert [(group["stuck_reason"], group["runs"], group["more"]) for group in one["stuck"]] == [
        ("paused_on_error", [], False)
    ]


def test_health_gives_the_verdict_its_reasons_and_notes_and_hides_a_schedules_error():
    paused_on_error()
    schedule = Ticked.add_schedule(every=timedelta(hours=1), name="hourly")
    WorkflowSchedule.objects.filter(pk=schedule.pk).update(
        last_error="token sk-123 refused", last_error_at=schedule.created_at
    )
    found = answer("health")
    assert found["healthy"] is False
    assert found["reasons"][0] == "no dispatcher is alive (no dispatcher has registered)"
    assert found["reasons"][1].startswith("schedule ticked/hourly failed at ")
    assert found["notes"] == ["1 run paused on an error"]
    assert found["stuck"]["paused_on_error"] == 1
    assert found["failing_schedules"][0]["last_error"].startswith("[redacted")
    assert "sk-123" not in str(found)


def test_insights_reads_the_class_pipeline_performance_and_funnel_over_the_window():
    finished()
    ready()
    found = answer("insights", {"workflow_class": "three_steps", "window": "1h"})
    assert found["workflow_class"] == "three_steps"
    assert found["window_seconds"] == timedelta(hours=1).total_seconds()
    assert found["steps"] == ["one", "two", "three"]
    assert found["funnel"]["started"] == 2 and found["funnel"]["finished"] == 1
    assert [row["step"] for row in found["performance"]] == ["one", "two", "three"]
    assert {"pipeline", "performance", "funnel"} <= set(found)
    assert answer("insights", {"workflow_class": "three_steps"})["window_seconds"] == 24 * 3600


def test_insights_of_an_unknown_class_or_window_is_a_tool_error():
    assert "No workflow class 'nope'" in tool_error("insights", {"workflow_class": "nope"})
    assert "window must be one of 1h, 6h, 24h, 7d; got '2h'" in tool_error(
        "insights", {"workflow_class": "three_steps", "window": "2h"}
    )


def test_list_schedules_lists_them_by_class_and_name_with_their_state_and_pages():
    nightly = Ticked.add_schedule(cron="30 2 * * *", timezone="Europe/Paris", name="nightly report")
    quarter = Ticked.add_schedule(every=timedelta(minutes=15), name="reminder sweep")
    listed = answer("list_schedules")
    assert [(row["id"], row["name"], row["state"]) for row in listed["schedules"]] == [
        (nightly.pk, "nightly report", "active"),
        (quarter.pk, "reminder sweep", "active"),
    ]
    assert listed["more"] is False
    second = answer("list_schedules", {"limit": 1, "page": 2})
    assert ([row["id"] for row in second["schedules"]], second["more"]) == ([quarter.pk], False)
    assert answer("list_schedules", {"limit": 1})["more"] is True
    assert answer("list_schedules", {"workflow_class": ["ticked"]})["schedules"] != []


# -- an unknown class ------------------------------------------------------------------------------

UNKNOWN = (
    "Error executing tool {}: No workflow class 'nope': none is registered under that name, "
    "no run or schedule of it is stored"
)


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("list_runs", {"workflow_class": ["three_steps", "nope"]}),
        ("stuck_runs", {"workflow_class": ["nope"]}),
        ("stuck_runs", {"workflow_class": ["nope"], "reason": "stalled"}),
        ("insights", {"workflow_class": "nope"}),
        ("list_schedules", {"workflow_class": ["nope", "ticked"]}),
    ],
)
def test_every_tool_that_takes_a_class_refuses_one_no_code_registers_and_no_row_names(tool, arguments):
    ready()
    assert tool_error(tool, arguments) == UNKNOWN.format(tool)


def test_a_class_the_code_no_longer_registers_is_known_by_its_stored_runs_and_schedules():
    orphan = ready()
    WorkflowRun.objects.filter(pk=orphan.record.pk).update(workflow_class="retired")
    schedule = Ticked.add_schedule(cron="0 * * * *", name="hourly")
    WorkflowSchedule.objects.filter(pk=schedule.pk).update(workflow_class="gone")
    assert ids(workflow_class=["retired"]) == {wid(orphan)}
    assert answer("stuck_runs", {"workflow_class": ["retired"], "reason": "stalled"})["stuck"][0]["runs"] == []
    assert answer("insights", {"workflow_class": "retired"})["funnel"]["started"] == 1
    assert [row["id"] for row in answer("list_schedules", {"workflow_class": ["gone"]})["schedules"]] == [schedule.pk]


# -- who may read ----------------------------------------------------------------------------------


def test_as_a_user_who_may_not_view_runs_every_read_tool_is_refused(django_user_model):
    staff_user(django_user_model, "nora")
    wf = ready()
    results = call_all(
        [
            ("health", {}),
            ("list_runs", {}),
            ("show_run", {"workflow_id": wid(wf)}),
            ("stuck_runs", {}),
            ("insights", {"workflow_class": "three_steps"}),
            ("list_schedules", {}),
            ("limits", {}),
        ],
        as_user="nora",
    )
    assert all(result.is_error for result in results)
    assert [text(result).split(": ", 1)[1] for result in results] == [
        "nora may not view workflow runs",
        "nora may not view workflow runs",
        "nora may not view workflow runs",
        "nora may not view workflow runs",
        "nora may not view workflow runs",
        "nora may not view workflow schedules",
        "nora may not view workflow runs",
    ]


def test_as_a_user_who_may_view_runs_the_reads_answer_and_a_missing_user_is_a_tool_error(django_user_model):
    staff_user(django_user_model, "vera", *VIEW)
    wf = waiting()
    assert [row["workflow_id"] for row in answer("list_runs", as_user="vera")["runs"]] == [wid(wf)]
    assert answer("show_run", {"workflow_id": wid(wf)}, as_user="vera")["allowed_verbs"] == []
    assert tool_error("list_runs", as_user="ghost") == (
        "Error executing tool list_runs: --as-user: there is no user 'ghost'"
    )


@SHOWN
def test_with_payloads_shown_a_steps_error_text_is_still_only_for_users_who_may_view_attempts(django_user_model):
    staff_user(django_user_model, "bob", "view_workflowrun", "view_workflowevent")
    staff_user(django_user_model, "carol", "view_workflowrun", "view_workflowevent", "view_workflowstep")
    wf = paused_on_error()

    page = answer("show_run", {"workflow_id": wid(wf)}, as_user="bob")
    failure = next(event for event in page["events"] if event["kind"] == "step_failed")
    assert page["run"]["paused_reason"] == failure["reason"] == failure["details"]["error_message"] == WITHHELD
    assert page["attempts"] is None

    for who in ("carol", None):  # without --as-user: the trusted shell
        page = answer("show_run", {"workflow_id": wid(wf)}, as_user=who)
        failure = next(event for event in page["events"] if event["kind"] == "step_failed")
        assert page["run"]["paused_reason"] == failure["reason"] == "RuntimeError: the first attempt fails"
        assert failure["details"]["error_message"] == "the first attempt fails"


def test_the_server_keeps_serving_after_bad_calls():
    wf = ready()
    results = call_all(
        [
            ("show_run", {"workflow_id": "0" * 32}),
            ("list_runs", {"limit": -1}),
            ("list_runs", {"page": "x", "status": "nope"}),
            ("no_such_tool", {}),
            ("insights", {"workflow_class": "x" * 300}),
            ("show_run", {"workflow_id": wid(wf)}),
        ]
    )
    assert [result.is_error for result in results] == [True] * 5 + [False]
    assert "Unknown tool: no_such_tool" in text(results[3])
    assert answered(results[-1])["run"]["workflow_id"] == wid(wf)
