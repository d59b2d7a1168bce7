"""``manage.py workflows``: list, show and the operator verbs from a terminal, on PostgreSQL.

Every subcommand runs through ``call_command`` and is judged by the rows and events it
leaves. A verb refuses what the service refuses, with the service's message, and changes
nothing; the actor and the reason are recorded as the admin records its user's. ``--as-user``
is in ``test_cli_permissions.py``, real processes in ``test_cli_processes.py``, the indexes
the queries use in ``test_cli_plans.py``.
"""

import getpass
import json
import uuid
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from pgbus_workflows.exceptions import WorkflowError
from pgbus_workflows.models import WorkflowRun, WorkflowSignal, WorkflowStep
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import CLOCK_SLACK, events_of, snapshot
from tests.testapp.models import Order
from tests.testapp.workflows import Approval, FailsFirst, ThreeSteps, Waits

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()

#: The actor of a command run without --actor or --as-user.
SHELL_ACTOR = f"cli:{getpass.getuser()}"


def cli(*args: str) -> tuple[str, str]:
    """Run ``manage.py workflows ARGS`` in this process; returns (stdout, stderr)."""
    out, err = StringIO(), StringIO()
    call_command("workflows", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def refusal(*args: str) -> str:
    """The CommandError message of a command that must fail."""
    with pytest.raises(CommandError) as error:
        cli(*args)
    return str(error.value)


def wid(wf) -> str:
    return str(wf.workflow_id)


# -- runs in given states ------------------------------------------------------------------------


def ready(subject=None):
    """A ready run whose first step is due."""
    return ThreeSteps.start(subject)


def finished():
    wf = ThreeSteps.start()
    helpers.speedrun_workflow(wf)
    assert wf.status == "finished"
    return wf


def paused_on_error(subject=None):
    wf = FailsFirst.start(subject)
    helpers.perform_next_step(wf)
    assert wf.status == "paused"
    return wf


def waiting():
    """A run parked on a step that waits for the "approved" signal."""
    wf = Approval.start()
    helpers.perform_next_step(wf)
    assert wf.status == "waiting"
    return wf


def due_later():
    """A ready run whose scheduled step is due in two seconds."""
    wf = Waits.start()
    helpers.perform_next_step(wf)
    assert WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled").scheduled_at > timezone.now()
    return wf


# -- list ------------------------------------------------------------------------------------------


def test_list_prints_the_newest_runs_first_in_aligned_columns():
    runs = [ready(Order.objects.create()), finished(), paused_on_error()]
    out, _err = cli("list")
    header, *rows, footer = out.splitlines()

    assert header.split() == ["RUN", "CLASS", "STATUS", "STEP", "ATTEMPT", "SUBJECT", "STATUS", "CHANGED"]
    assert [row.split()[0] for row in rows] == [wid(wf) for wf in reversed(runs)]
    for row, wf in zip(rows, reversed(runs), strict=True):
        record = WorkflowRun.objects.get(pk=wf.record.pk)
        for heading, value in (
            ("CLASS", record.workflow_class),
            ("STATUS", record.status),
            ("STEP", record.current_step),
        ):
            assert row[header.index(heading) :].startswith(value + " "), (heading, row)
    assert rows[-1][header.index("SUBJECT") :].startswith(f"testapp.order:{runs[0].record.subject_id} ")
    assert footer == "3 runs, newest first"


def test_list_shows_at_most_limit_runs_and_says_when_more_match():
    runs = [ready() for _ in range(4)]
    out, _err = cli("list", "--limit", "2")
    assert [line.split()[0] for line in out.splitlines()[1:3]] == [wid(runs[3]), wid(runs[2])]
    assert out.splitlines()[-1] == "2 runs, newest first; more match (raise --limit or narrow the filters)"

    rows = json.loads(cli("list", "--limit", "2", "--json")[0])
    assert [row["workflow_id"] for row in rows] == [wid(runs[3]), wid(runs[2])]


def test_list_json_is_one_document_a_list_of_run_objects():
    wf = paused_on_error(Order.objects.create())
    rows = json.loads(cli("list", "--json")[0])
    assert len(rows) == 1
    row = rows[0]
    assert row["workflow_id"] == wid(wf)
    assert (row["workflow_class"], row["status"], row["current_step"], row["attempt"]) == (
        "fails_first",
        "paused",
        "flaky",
        1,
    )
    assert row["subject"] == f"testapp.order:{wf.record.subject_id}"
    assert (
        datetime.fromisoformat(row["status_changed_at"]) == WorkflowRun.objects.get(pk=wf.record.pk).status_changed_at
    )


def test_list_filters_by_class_status_stuck_reason_and_subject():
    first, second = Order.objects.create(), Order.objects.create()
    a = ready(first)
    b = paused_on_error(second)
    c = finished()
    d = ready(second)

    def ids(*args):
        return set(cli("list", "--ids", *args)[0].split())

    assert ids() == {wid(a), wid(b), wid(c), wid(d)}
    assert ids("--class", "three_steps") == {wid(a), wid(c), wid(d)}
    assert ids("--class", "fails_first", "--class", "three_steps", "--status", "finished") == {wid(c)}
    assert ids("--status", "paused") == {wid(b)}
    assert ids("--status", "paused", "--status", "finished") == {wid(b), wid(c)}
    assert ids("--stuck", "paused_on_error") == {wid(b)}
    assert ids("--stuck", "stalled") == set()
    assert ids("--subject", f"testapp.order:{second.pk}") == {wid(b), wid(d)}
    assert ids("--subject", f"TestApp.Order:{first.pk}") == {wid(a)}
    assert ids("--subject", "testapp.order", "--status", "ready") == {wid(a), wid(d)}
    assert cli("list", "--class", "fails_first", "--status", "ready")[0] == "No runs match.\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--subject", "order"), "--subject: a subject is app_label.model:pk (shop.order:42) or app_label.model"),
        (("--subject", "testapp.order:"), "--subject: a subject is app_label.model:pk"),
        (("--status", "stuck"), "argument --status: invalid choice: 'stuck'"),
        (("--stuck", "lost"), "argument --stuck: invalid choice: 'lost'"),
        (("--limit", "0"), "argument --limit: must be at least 1, got 0"),
    ],
)
def test_list_refuses_a_bad_filter_in_one_line(args, message):
    ready()
    assert message in refusal("list", *args)


# -- show ------------------------------------------------------------------------------------------


def test_show_prints_the_run_its_attempts_events_and_the_verbs_it_may_take():
    wf = paused_on_error(Order.objects.create())
    out, _err = cli("show", wid(wf))

    assert out.splitlines()[0] == f"Run {wid(wf)}"
    assert "  class            fails_first" in out
    assert "  status           paused" in out
    assert "RuntimeError: the first attempt fails" in out
    assert "may now          resume, resume --at STEP, skip, cancel" in out
    attempts = out[out.index("Attempts") : out.index("Events")].splitlines()
    assert attempts[1].split()[:4] == ["STEP", "#", "STATUS", "OUTCOME"]
    assert attempts[2].split()[:4] == ["flaky", "1", "failed", "failed"]
    events = out[out.index("Events") :]
    for kind in ("started", "step_started", "step_failed"):
        assert f"  {kind} " in events
    assert "performing -> paused" in events
    assert "Pending signals: none" in out
    page = json.loads(cli("show", wid(wf), "--json")[0])
    assert page["allowed_verbs"] == ["resume", "resume_at", "skip", "cancel", "fork"]  # the verbs' own names


def test_show_json_has_the_attempts_events_pending_signals_and_allowed_verbs():
    wf = Approval.start()
    wf.signal("approved", {"amount": 42}, actor="webhook")  # its step has not parked yet: pending
    page = json.loads(cli("show", wid(wf)[:8], "--json")[0])

    assert page["run"]["workflow_id"] == wid(wf)
    assert page["run"]["status"] == "ready"
    assert [(a["step_name"], a["status"]) for a in page["attempts"]] == [("approve", "scheduled")]
    assert [e["kind"] for e in page["events"]] == ["started", "signal_received"]
    assert page["events"][1]["actor"] == "webhook"
    assert [(s["name"], s["payload"], s["actor"]) for s in page["pending_signals"]] == [
        ("approved", {"amount": 42}, "webhook")
    ]
    assert page["allowed_verbs"] == ["pause", "skip", "signal", "cancel", "fork"]


def test_show_shows_the_latest_attempts_and_events_it_is_asked_for():
    wf = finished()
    page = json.loads(cli("show", wid(wf), "--json", "--attempts", "2", "--events", "3")[0])
    assert [a["step_name"] for a in page["attempts"]] == ["two", "three"]
    assert page["older_attempts_omitted"] is True
    assert [e["kind"] for e in page["events"]] == [e.kind for e in events_of(wf)][-3:]
    assert page["older_events_omitted"] is True
    assert "(the latest 2; raise --attempts for more)" in cli("show", wid(wf), "--attempts", "2")[0]


def test_show_finds_a_run_by_the_start_of_its_id_and_refuses_unknown_or_ambiguous_ones():
    a, b = ready(), ready()
    assert json.loads(cli("show", wid(a)[:8], "--json")[0])["run"]["workflow_id"] == wid(a)
    assert json.loads(cli("show", wid(a).replace("-", "").upper(), "--json")[0])["run"]["workflow_id"] == wid(a)

    twin = uuid.UUID(wid(a).replace("-", "")[:8] + uuid.uuid4().hex[8:])
    WorkflowRun.objects.filter(pk=b.record.pk).update(workflow_id=twin)
    assert refusal("show", wid(a)[:8]) == f"Several workflow runs start with {wid(a)[:8]}: give more of the id"
    assert json.loads(cli("show", wid(a), "--json")[0])["run"]["workflow_id"] == wid(a)
    assert refusal("show", "0000000000") == "No workflow run 0000000000"
    assert refusal("show", "abc") == "'abc' is not a workflow id (its 32 hex digits, or the first 8 or more)"
    assert refusal("show", "not-a-uuid-at-all").endswith(
        "is not a workflow id (its 32 hex digits, or the first 8 or more)"
    )


# -- the verbs -------------------------------------------------------------------------------------


def test_pause_and_resume_record_the_shell_user_or_the_actor_and_the_reason():
    wf = ready()
    out, err = cli("pause", wid(wf), "--reason", "fraud check")
    assert (out, err) == (f"{wid(wf)}  paused (now paused, step one)\n", "")
    event = events_of(wf, "paused")[-1]
    assert (event.actor, event.reason) == (SHELL_ACTOR, "fraud check")
    assert wf.reload().record.paused_reason == "fraud check"

    cli("resume", wid(wf), "--actor", "ops-bot")
    event = events_of(wf, "resumed")[-1]
    assert (event.actor, event.reason) == ("ops-bot", "")
    assert wf.reload().status == "ready"


def test_resume_at_goes_on_at_that_step_now():
    wf = paused_on_error()
    result = json.loads(cli("resume", wid(wf), "--at", "after", "--reason", "flaky fixed by hand", "--json")[0])
    assert result == [
        {
            "run": wid(wf),
            "verb": "resume_at",
            "ok": True,
            "message": "resumed",
            "status": "ready",
            "current_step": "after",
        }
    ]
    event = events_of(wf, "resumed_at")[-1]
    assert (event.actor, event.reason, event.details) == (SHELL_ACTOR, "flaky fixed by hand", {"step": "after"})
    assert WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled").step_name == "after"

    other = paused_on_error()
    before = snapshot(other)
    message = refusal("resume", wid(other), "--at", "nope")
    assert message.startswith(f"{wid(other)}: ") and "nope" in message
    assert snapshot(other) == before


def test_cancel_rerun_skip_and_run_now_move_the_run_and_record_who_and_why():
    wf = ready()
    cli("cancel", wid(wf), "--reason", "customer asked")
    assert wf.reload().status == "cancelled"
    assert [(e.actor, e.reason) for e in events_of(wf, "cancelled")] == [(SHELL_ACTOR, "customer asked")]

    result = json.loads(cli("rerun", wid(wf), "--actor", "alice", "--json")[0])[0]
    new = WorkflowRun.objects.get(workflow_id=result["new_run"])
    assert (new.workflow_class, new.status, new.rerun_of) == ("three_steps", "ready", wf.workflow_id)
    assert [(e.actor, e.details) for e in events_of(wf, "rerun")] == [("alice", {"new_workflow_id": result["new_run"]})]

    flaky = paused_on_error()
    cli("skip", wid(flaky), "--reason", "not needed")
    assert flaky.reload().current_step == "after"
    skipped = events_of(flaky, "step_skipped")[-1]
    assert (skipped.actor, skipped.reason, skipped.details["skipped"]) == (SHELL_ACTOR, "not needed", "flaky")

    later = due_later()
    due_at = WorkflowStep.objects.get(run_id=later.record.pk, status="scheduled").scheduled_at
    cli("run-now", wid(later))
    step = WorkflowStep.objects.get(run_id=later.record.pk, status="scheduled")
    # Due now by the database's clock as the engine reads it (``clock.now()``, anchored by a
    # round trip): within a few milliseconds of this process's clock, and never the wait's end.
    assert step.scheduled_at <= timezone.now() + CLOCK_SLACK
    assert step.scheduled_at < due_at - timedelta(seconds=1)
    assert events_of(later, "run_now")[-1].actor == SHELL_ACTOR


def test_signal_wakes_the_waiting_step_with_the_payload_and_a_repeated_key_changes_nothing():
    wf = waiting()
    args = ("signal", "approved", wid(wf), "--payload", '{"amount": 42}', "--idempotency-key", "evt-1", "--json")
    first = json.loads(cli(*args)[0])[0]
    assert (first["ok"], first["duplicate_delivery"], first["status"]) == (True, False, "ready")
    signal = WorkflowSignal.objects.get(run_id=wf.record.pk)
    assert (signal.pk, signal.payload, signal.actor, signal.status) == (
        first["signal"]["id"],
        {"amount": 42},
        SHELL_ACTOR,
        "consumed",
    )
    assert events_of(wf, "step_woken")[-1].actor == SHELL_ACTOR

    before = snapshot(wf)
    again = json.loads(cli(*args)[0])[0]
    assert (again["ok"], again["duplicate_delivery"], again["signal"]["id"]) == (True, True, signal.pk)
    assert again["message"] == "already delivered with this idempotency key: nothing changed"
    assert snapshot(wf) == before


def test_signal_refuses_an_unknown_name_and_bad_payloads_and_writes_nothing():
    wf = waiting()
    before = snapshot(wf)
    message = refusal("signal", "aproved", wid(wf))
    assert message.startswith(f"{wid(wf)}: No step of approval waits for signal 'aproved' (did you mean 'approved'?)")
    assert refusal("signal", "approved", wid(wf), "--payload", "{nope") == (
        "--payload is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    )
    assert "over MAX_PAYLOAD_SIZE" in refusal("signal", "approved", wid(wf), "--payload", json.dumps("x" * 5000))
    assert refusal("signal", " ", wid(wf)) == "A signal name must be a non-empty string, got ' '"
    assert snapshot(wf) == before


REFUSED_ON_A_FINISHED_RUN = [
    (("pause",), lambda wf: wf.pause()),
    (("resume",), lambda wf: wf.resume()),
    (("resume", "--at", "one"), lambda wf: wf.resume_at("one")),
    (("cancel",), lambda wf: wf.cancel()),
    (("run-now",), lambda wf: wf.run_now()),
    (("skip",), lambda wf: wf.skip()),
]


@pytest.mark.parametrize(
    ("args", "verb"), REFUSED_ON_A_FINISHED_RUN, ids=lambda v: " ".join(v) if isinstance(v, tuple) else ""
)
def test_a_refused_verb_says_what_the_service_says_and_changes_nothing(args, verb):
    wf = finished()
    with pytest.raises(WorkflowError) as expected:
        verb(ThreeSteps.find(wf.workflow_id))
    before = snapshot(wf)
    assert refusal(*args, wid(wf)) == f"{wid(wf)}: {expected.value}"
    assert snapshot(wf) == before


def test_rerun_of_an_ongoing_run_is_refused_with_the_services_message():
    wf = ready()
    assert refusal("rerun", wid(wf)) == (
        f"{wid(wf)}: Cannot rerun a ready workflow: only finished or cancelled runs rerun (cancel it first)"
    )


def test_a_verb_on_several_runs_reports_each_and_exits_nonzero_if_any_was_refused():
    a, done, b = ready(), finished(), ready()
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match=r"^2 of 4 runs refused$"):
        call_command("workflows", "pause", wid(a), wid(done), wid(b), "cafebabe00", stdout=out, stderr=err)
    assert out.getvalue().splitlines() == [
        f"{wid(a)}  paused (now paused, step one)",
        f"{wid(b)}  paused (now paused, step one)",
    ]
    # an id that names no run is refused like the finished run: reported, and counted
    assert err.getvalue().splitlines() == [
        f"{wid(done)}  refused: Cannot pause a finished workflow",
        "cafebabe00  refused: No workflow run cafebabe00",
    ]
    assert [a.reload().status, b.reload().status, done.reload().status] == ["paused", "paused", "finished"]

    out = StringIO()
    with pytest.raises(CommandError, match=r"^2 of 3 runs refused$"):
        call_command("workflows", "resume", wid(a), wid(done), wid(done), "--json", stdout=out, stderr=StringIO())
    results = json.loads(out.getvalue())
    assert [(r["run"], r["ok"]) for r in results] == [(wid(a), True), (wid(done), False), (wid(done), False)]
    assert results[1]["error_class"] == "NotPaused"
    assert results[1]["message"] == "Cannot resume a finished workflow: it is not paused"


def test_bad_actor_options_are_refused_before_anything_is_done():
    wf = ready()
    before = snapshot(wf)
    assert refusal("pause", wid(wf), "--actor", " ") == "--actor must not be empty"
    assert refusal("pause", wid(wf), "--actor", "x" * 256) == "--actor must be at most 255 characters, got 256"
    assert snapshot(wf) == before
