"""``manage.py workflows schedules list|pause|resume|fire-now``: the schedule admin's verbs from a terminal.

Judged by the schedule rows, their audit trail and the runs they start; ``--as-user`` is asked
as the schedule admin asks (the pause or fire permission and the view permission).
"""

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from pgbus_workflows.models import WorkflowRun, WorkflowSchedule
from pgbus_workflows.testing import tick_schedules
from tests.management.test_cli import SHELL_ACTOR, cli, refusal
from tests.management.test_cli_processes import finish, manage
from tests.support import staff_user
from tests.testapp.workflows import Ticked

pytestmark = pytest.mark.django_db

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def nightly() -> WorkflowSchedule:
    return Ticked.add_schedule(cron="30 2 * * *", timezone="Europe/Paris", name="nightly report")


@pytest.fixture
def quarter() -> WorkflowSchedule:
    return Ticked.add_schedule(every=timedelta(minutes=15), start_at=START, name="reminder sweep")


def trail(schedule: WorkflowSchedule) -> list[tuple[str, str, str]]:
    return [(e.kind, e.actor, e.reason) for e in schedule.events.exclude(kind="created").order_by("pk")]


def test_list_prints_each_schedule_its_state_and_next_fire_and_json_has_them_all(nightly, quarter):
    out, _err = cli("schedules", "list")
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "CLASS", "NAME", "STATE", "WHEN", "NEXT", "FIRE", "LAST", "FIRED"]
    assert lines[1].startswith(f"{nightly.pk}") and "nightly report" in lines[1] and "active" in lines[1]
    assert "At 02:30 every day (Europe/Paris)" in lines[1] and "Every 15 minutes" in lines[2]

    cli("schedules", "pause", str(nightly.pk))
    rows = json.loads(cli("schedules", "list", "--json")[0])
    assert [(r["id"], r["name"], r["state"], r["expression"]) for r in rows] == [
        (nightly.pk, "nightly report", "paused", "30 2 * * *"),
        (quarter.pk, "reminder sweep", "active", "every 900s"),
    ]
    assert rows[0]["next_fire_at"] is None and rows[1]["next_fire_at"] == quarter.next_fire_at.isoformat()
    assert cli("schedules", "list", "--class", "nope")[0] == "No schedules.\n"


def test_pause_and_resume_by_id_or_class_and_name_record_the_actor_and_the_reason(nightly):
    out, _err = cli("schedules", "pause", "ticked:nightly report", "--reason", "database migrating")
    assert out == "ticked:nightly report  paused\n"
    nightly.refresh_from_db()
    assert nightly.paused

    out, _err = cli("schedules", "resume", str(nightly.pk), "--actor", "ops-bot", "--reason", "migrated")
    assert out == "ticked:nightly report  resumed: its next tick is the first from now\n"
    nightly.refresh_from_db()
    assert not nightly.paused
    assert trail(nightly) == [("paused", SHELL_ACTOR, "database migrating"), ("resumed", "ops-bot", "migrated")]


def test_fire_now_starts_a_run_and_a_second_is_refused_while_it_runs_with_overlap_skip(quarter):
    out, _err = cli("schedules", "fire-now", "ticked:reminder sweep", "--json")
    [result] = json.loads(out)
    run = WorkflowRun.objects.get(schedule=quarter)
    assert result == {
        "schedule": "ticked:reminder sweep",
        "verb": "fire_now",
        "ok": True,
        "message": f"fired: run {run.workflow_id} (ready)",
        "run": str(run.workflow_id),
        "run_status": "ready",
    }
    assert refusal("schedules", "fire-now", str(quarter.pk)) == (
        f"ticked:reminder sweep: Cannot fire ticked reminder sweep: its run {run.workflow_id} is still ongoing "
        "and its overlap is 'skip' (wait for it, or cancel it)"
    )
    assert WorkflowRun.objects.filter(schedule=quarter).count() == 1
    assert [kind for kind, _actor, _reason in trail(quarter)] == ["fired_now"]


def test_refusals_say_why_and_change_nothing_but_each_schedule_is_its_own_transaction(nightly, quarter):
    assert refusal("schedules", "resume", str(nightly.pk)) == (
        "ticked:nightly report: Cannot resume schedule ticked nightly report: it is not paused"
    )
    assert refusal("schedules", "pause", "ticked:nope") == "ticked:nope: there is no schedule ticked:nope"
    assert refusal("schedules", "pause", "nightly") == "nightly: 'nightly' is not a schedule (its id, or CLASS:NAME)"
    assert refusal("schedules", "pause", str(nightly.pk), "ticked:nope", str(quarter.pk)) == "1 of 3 schedules refused"
    nightly.refresh_from_db()
    quarter.refresh_from_db()
    assert nightly.paused and quarter.paused  # each schedule its own transaction: the others were paused


def test_as_user_needs_the_schedule_admins_permissions(django_user_model, nightly):
    staff_user(django_user_model, "viv", "view_workflowschedule")
    staff_user(django_user_model, "paula", "view_workflowschedule", "pause_workflowschedule")
    staff_user(django_user_model, "nemo", "pause_workflowschedule")

    assert refusal("schedules", "pause", str(nightly.pk), "--as-user", "viv") == (
        "ticked:nightly report: viv may not pause it (it needs the permission "
        "pgbus_workflows.pause_workflowschedule and the view permission on it)"
    )
    assert "viv may not fire it now" in refusal("schedules", "fire-now", str(nightly.pk), "--as-user", "viv")
    assert refusal("schedules", "list", "--as-user", "nemo") == "nemo may not view workflow schedules"
    assert "nightly report" in cli("schedules", "list", "--as-user", "viv")[0]
    assert trail(nightly) == [] and not WorkflowRun.objects.exists()

    cli("schedules", "pause", str(nightly.pk), "--as-user", "paula", "--reason", "holiday")
    assert trail(nightly) == [("paused", "paula", "holiday")]
    assert refusal("schedules", "pause", str(nightly.pk), "--as-user", "paula", "--actor", "x") == (
        "--actor and --as-user do not go together: the user's username is the actor"
    )


def test_list_says_disabled_and_class_not_registered_and_the_last_tick_fired(nightly, quarter):
    [run] = tick_schedules(now=START + timedelta(minutes=15))
    WorkflowSchedule.objects.filter(pk=nightly.pk).update(enabled=False)  # as `enabled=False` in code leaves it
    gone = Ticked.add_schedule(every=timedelta(hours=1), name="of a removed class")
    WorkflowSchedule.objects.filter(pk=gone.pk).update(workflow_class="removed_class")

    rows = {row["name"]: row for row in json.loads(cli("schedules", "list", "--json")[0])}
    assert rows["nightly report"]["state"] == "disabled" and rows["nightly report"]["next_fire_at"] is None
    assert rows["of a removed class"]["state"] == "class not registered"
    assert rows["reminder sweep"]["last_fired_at"] == run.record.scheduled_for.isoformat()
    out = cli("schedules", "list")[0]
    assert "class not registered" in out and "2026-06-01 12:15:00" in out  # the last tick, local time (UTC here)


def test_several_schedules_report_each_on_its_line_and_a_process_exits_1(nightly, quarter):
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match=r"^1 of 3 schedules refused$"):
        call_command(
            "workflows", "schedules", "pause", str(nightly.pk), "ticked:nope", str(quarter.pk), stdout=out, stderr=err
        )
    assert out.getvalue() == "ticked:nightly report  paused\nticked:reminder sweep  paused\n"
    assert err.getvalue() == "ticked:nope  refused: there is no schedule ticked:nope\n"


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_real_process_exits_0_when_done_and_1_with_one_line_when_refused():
    schedule = Ticked.add_schedule(every=timedelta(minutes=5), name="five")
    assert finish(manage("schedules", "pause", "ticked:five")) == (0, "ticked:five  paused\n", "")
    code, out, err = finish(manage("schedules", "pause", str(schedule.pk)))
    assert (code, out) == (1, "")
    assert err == "CommandError: ticked:five: Cannot pause schedule ticked five: it is already paused\n"


def test_resume_takes_the_pause_permission_and_fire_now_the_fire_permission(django_user_model, nightly):
    staff_user(django_user_model, "paula", "view_workflowschedule", "pause_workflowschedule")
    staff_user(django_user_model, "fred", "view_workflowschedule", "fire_workflowschedule")
    staff_user(django_user_model, "nemo", "pause_workflowschedule")

    assert refusal("schedules", "pause", str(nightly.pk), "--as-user", "nemo") == "nemo may not view workflow schedules"
    assert "fred may not pause it" in refusal("schedules", "pause", str(nightly.pk), "--as-user", "fred")
    cli("schedules", "pause", str(nightly.pk), "--as-user", "paula")
    assert "fred may not resume it" in refusal("schedules", "resume", str(nightly.pk), "--as-user", "fred")
    cli("schedules", "resume", str(nightly.pk), "--as-user", "paula")
    assert "paula may not fire it now" in refusal("schedules", "fire-now", str(nightly.pk), "--as-user", "paula")
    out, _err = cli("schedules", "fire-now", str(nightly.pk), "--as-user", "fred")
    run = WorkflowRun.objects.get(schedule=nightly)
    assert out == f"ticked:nightly report  fired: run {run.workflow_id} (ready)\n"
    assert trail(nightly) == [("paused", "paula", ""), ("resumed", "paula", ""), ("fired_now", "fred", "")]


def test_json_of_a_verb_is_one_result_per_schedule(nightly, quarter):
    cli("schedules", "pause", str(nightly.pk))
    out = StringIO()
    with pytest.raises(CommandError, match=r"^1 of 2 schedules refused$"):
        call_command("workflows", "schedules", "resume", str(nightly.pk), str(quarter.pk), "--json", stdout=out)
    assert json.loads(out.getvalue()) == [
        {
            "schedule": "ticked:nightly report",
            "verb": "resume",
            "ok": True,
            "state": "active",
            "message": "resumed: its next tick is the first from now",
            "next_fire_at": WorkflowSchedule.objects.get(pk=nightly.pk).next_fire_at.isoformat(),
        },
        {
            "schedule": "ticked:reminder sweep",
            "verb": "resume",
            "ok": False,
            "error_class": "InvalidTransition",
            "message": "Cannot resume schedule ticked reminder sweep: it is not paused",
        },
    ]
    rows = json.loads(cli("schedules", "list", "--json")[0])
    keys = ["id", "workflow_class", "name", "state", "expression", "in_words", "next_fire_at", "last_fired_at"]
    assert all(list(row) == keys for row in rows)
