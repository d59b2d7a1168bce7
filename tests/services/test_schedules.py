"""Scheduled workflows: declared and added schedules, each tick one run, the overlap and catch-up policies.

Ticks are fired with the test helper ``tick_schedules(now=...)``, which calls the service the
dispatcher's leader calls; the process tests (``test_schedule_processes``) fire them with real
dispatchers.
"""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.checks import Tags, run_checks
from django.db import IntegrityError, transaction

from pgbus_workflows import ConfigurationError, InvalidTransition, PayloadTooLarge, Schedule, Workflow, step
from pgbus_workflows.dispatcher.scheduler import STANDBY_INTERVAL, ScheduleLeader
from pgbus_workflows.dsl.schedules import jitter_offset
from pgbus_workflows.models import ScheduleEvent, WorkflowEvent, WorkflowRun, WorkflowSchedule
from pgbus_workflows.services import schedules as schedule_verbs
from pgbus_workflows.services.firing import fire_due, fire_schedule
from pgbus_workflows.testing import WorkflowTestMixin, tick_schedules
from tests.testapp.models import SideEffect
from tests.testapp.workflows import Ticked, YearlyReport
from tests.threads import Worker

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def database_checks():
    return {m.id: m for m in run_checks(tags=[Tags.database], databases=["default"]) if m.id.startswith("pgbus")}


def events(schedule, kind):
    return list(ScheduleEvent.objects.filter(schedule=schedule, kind=kind).order_by("pk"))


def every_minute(**options):
    """A Ticked schedule every minute whose first tick is T0 + 1 minute."""
    return Ticked.add_schedule(every=MINUTE, start_at=T0, **options)


# -- declared schedules --------------------------------------------------------------------------


def test_declared_schedules_are_synced_to_rows_with_their_first_tick_after_now():
    assert tick_schedules(now=T0) == []  # nothing was due: the sync only made the rows
    rows = {s.name: s for s in WorkflowSchedule.objects.filter(workflow_class="yearly_report")}
    assert set(rows) == {"cron 0 3 1 1 *", "leap"}
    yearly, leap = rows["cron 0 3 1 1 *"], rows["leap"]
    assert (yearly.cron, yearly.timezone, yearly.arguments, yearly.declared) == (
        "0 3 1 1 *",
        "Europe/Paris",
        {"kind": "yearly"},
        True,
    )
    assert yearly.next_fire_at == datetime(2027, 1, 1, 2, 0, tzinfo=UTC)  # 03:00 in Paris is 02:00 UTC in winter
    assert yearly.in_words == "At 03:00 on January 1 (Europe/Paris)"
    assert (leap.every, leap.overlap, leap.catchup, leap.enabled) == (timedelta(days=366), "allow", "all", False)
    assert [e.kind for e in yearly.events.all()] == ["created"]


def test_a_changed_declaration_updates_its_row_and_a_removed_one_is_deleted(monkeypatch):
    schedule_verbs.sync_declared(T0)
    row = WorkflowSchedule.objects.get(workflow_class="yearly_report", name="cron 0 3 1 1 *")
    schedule_verbs.pause(row.pk, actor="alice")
    changed = Schedule(cron="0 3 1 1 *", timezone="America/New_York", name="cron 0 3 1 1 *")
    monkeypatch.setattr(YearlyReport, "schedules", [changed])

    assert schedule_verbs.sync_declared(T0) == {"created": 0, "changed": 1, "deleted": 1, "failed": 0}

    row.refresh_from_db()
    assert (row.timezone, row.arguments, row.paused) == ("America/New_York", {}, True)  # the operator's pause stays
    assert row.next_fire_at == datetime(2027, 1, 1, 8, 0, tzinfo=UTC)
    assert events(row, "changed")[0].details == {"changed": ["arguments", "timezone"]}
    assert not WorkflowSchedule.objects.filter(name="leap").exists()
    assert schedule_verbs.sync_declared(T0) == {"created": 0, "changed": 0, "deleted": 0, "failed": 0}


def test_bad_declarations_fail_when_the_class_is_defined():
    with pytest.raises(ConfigurationError, match="must be a list of Schedule"):

        class NotSchedules(Workflow):
            schedules = ["0 3 * * *"]

            @step
            def one(self):
                pass

    with pytest.raises(ConfigurationError, match="two schedules named 'nightly'"):

        class TwoNightlies(Workflow):
            schedules = [Schedule(cron="0 3 * * *", name="nightly"), Schedule(cron="0 4 * * *", name="nightly")]

            @step
            def one(self):
                pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "0 3 * *"}, "has 4 fields: use 5"),
        ({"cron": "0 25 * * *"}, "is not valid: Bad hour"),
        ({"cron": "0 3 * * *", "every": 60}, "exactly one of cron= and every="),
        ({}, "exactly one of cron= and every="),
        ({"cron": "0 3 * * *", "timezone": "Europe/Pariss"}, "Unknown time zone 'Europe/Pariss'"),
        ({"every": 0.5}, "at least 1 second"),
        ({"every": 1.5}, "whole number of seconds"),
        ({"every": 60, "overlap": "queue"}, "Unknown overlap 'queue'"),
        ({"every": 60, "catchup": "some"}, "Unknown catchup 'some'"),
        ({"every": 60, "jitter": -1}, "jitter must not be negative"),
        ({"every": 60, "arguments": [1]}, "arguments must be a dict"),
        ({"every": timedelta(days=3661)}, "every must be at most 3660 days"),
        ({"every": 60, "jitter": timedelta(days=3661)}, "jitter must be at most 3660 days"),
    ],
)
def test_a_bad_schedule_is_a_configuration_error_and_adds_nothing(options, message):
    with pytest.raises(ConfigurationError, match=message):
        Schedule(**options)
    with pytest.raises(ConfigurationError, match=message):
        Ticked.add_schedule(**options)
    assert not WorkflowSchedule.objects.exists()


def test_add_schedule_refuses_a_taken_name_a_naive_start_and_arguments_too_large():
    every_minute(name="sweep")
    with pytest.raises(ValueError, match="already has a schedule named 'sweep'"):
        every_minute(name="sweep")
    with pytest.raises(ValueError, match="start_at must be an aware datetime"):
        Ticked.add_schedule(every=60, start_at=datetime(2026, 1, 1))
    with pytest.raises(PayloadTooLarge):
        Ticked.add_schedule(every=60, name="big", arguments={"blob": "x" * 10_000})
    assert list(WorkflowSchedule.objects.values_list("name", flat=True)) == ["sweep"]


# -- a tick, a run ----------------------------------------------------------------------------------


class TestOneRunPerTick(WorkflowTestMixin):
    def test_a_tick_starts_one_run_with_its_scheduled_for_on_the_row_the_handle_and_in_the_body(self):
        schedule = every_minute(arguments={"region": "eu"})
        assert self.tick_schedules(now=T0 + timedelta(seconds=59)) == []

        [wf] = self.tick_schedules(now=T0 + MINUTE)

        tick = T0 + MINUTE
        assert wf.scheduled_for == tick
        assert (wf.record.schedule_id, wf.record.scheduled_for, wf.arguments) == (schedule.pk, tick, {"region": "eu"})
        started = wf.events.get(kind="started")
        assert (started.actor, started.details["scheduled_for"]) == ("scheduler", tick.isoformat())
        schedule.refresh_from_db()
        assert (schedule.last_fired_at, schedule.last_run_id, schedule.next_fire_at) == (
            tick,
            wf.record.pk,
            tick + MINUTE,
        )
        self.speedrun_workflow(wf)
        assert list(SideEffect.objects.values_list("label", "key")) == [("ticked", tick.isoformat())]
        assert self.tick_schedules(now=T0 + MINUTE) == []  # the same moment again: nothing more is due

    def test_the_database_refuses_a_second_run_for_one_tick(self):
        schedule = every_minute(overlap="allow")
        [wf] = self.tick_schedules(now=T0 + MINUTE)
        with pytest.raises(IntegrityError, match="pgbus_wf_one_run_per_tick"), transaction.atomic():
            WorkflowRun.objects.create(workflow_class="ticked", schedule=schedule, scheduled_for=wf.scheduled_for)


@pytest.mark.django_db(transaction=True)
def test_firers_racing_for_one_tick_start_exactly_one_run():
    schedule = every_minute(overlap="allow", catchup="all")
    now = T0 + MINUTE
    workers = [Worker(fire_schedule, schedule.pk, now) for _ in range(4)]
    for worker in workers:
        worker.start()
    started = [handle for worker in workers for handle in worker.finish()]

    assert len(started) == 1
    assert list(WorkflowRun.objects.values_list("scheduled_for", flat=True)) == [now]
    schedule.refresh_from_db()
    assert schedule.next_fire_at == now + MINUTE


# -- overlap ----------------------------------------------------------------------------------------


class TestOverlap(WorkflowTestMixin):
    def test_skip_records_the_tick_while_the_last_run_is_ongoing_and_fires_again_once_it_ended(self):
        schedule = every_minute()  # overlap="skip" is the default
        [first] = self.tick_schedules(now=T0 + MINUTE)

        assert self.tick_schedules(now=T0 + 2 * MINUTE) == []

        [skipped] = events(schedule, "tick_skipped")
        assert skipped.run_id == first.record.pk
        assert skipped.details == {"scheduled_for": (T0 + 2 * MINUTE).isoformat(), "ongoing": [str(first.workflow_id)]}
        self.speedrun_workflow(first)
        [second] = self.tick_schedules(now=T0 + 3 * MINUTE)
        assert second.scheduled_for == T0 + 3 * MINUTE

    def test_allow_starts_a_run_per_tick_whatever_is_ongoing(self):
        every_minute(overlap="allow")
        runs = self.tick_schedules(now=T0 + MINUTE) + self.tick_schedules(now=T0 + 2 * MINUTE)
        assert [wf.reload().status for wf in runs] == ["ready", "ready"]

    def test_cancel_previous_cancels_the_ongoing_run_and_starts_the_new_one(self):
        schedule = every_minute(overlap="cancel_previous")
        [first] = self.tick_schedules(now=T0 + MINUTE)

        [second] = self.tick_schedules(now=T0 + 2 * MINUTE)

        assert (first.reload().status, second.reload().status) == ("cancelled", "ready")
        cancelled = first.events.get(kind="cancelled")
        assert cancelled.actor == "scheduler" and "cancels the previous run" in cancelled.reason
        assert [e.run_id for e in events(schedule, "previous_cancelled")] == [first.record.pk]


# -- catch-up ---------------------------------------------------------------------------------------


def test_catchup_latest_fires_only_the_newest_missed_tick_and_records_the_others():
    schedule = every_minute(overlap="allow")  # catchup="latest" is the default

    [wf] = tick_schedules(now=T0 + 10 * MINUTE + timedelta(seconds=5))

    assert wf.scheduled_for == T0 + 10 * MINUTE
    [missed] = events(schedule, "ticks_missed")
    assert missed.details == {"first": (T0 + MINUTE).isoformat(), "last": (T0 + 9 * MINUTE).isoformat()}


def test_catchup_all_fires_every_missed_tick_oldest_first():
    every_minute(overlap="allow", catchup="all")

    runs = tick_schedules(now=T0 + 150 * MINUTE)

    assert [wf.scheduled_for for wf in runs] == [T0 + n * MINUTE for n in range(1, 151)]
    assert WorkflowRun.objects.count() == 150


def test_catchup_all_with_overlap_skip_records_each_skipped_tick():
    schedule = every_minute(catchup="all")
    runs = tick_schedules(now=T0 + 3 * MINUTE)
    assert [wf.scheduled_for for wf in runs] == [T0 + MINUTE]
    assert [e.details["scheduled_for"] for e in events(schedule, "tick_skipped")] == [
        (T0 + 2 * MINUTE).isoformat(),
        (T0 + 3 * MINUTE).isoformat(),
    ]


def test_catchup_none_fires_a_tick_on_time_and_drops_late_ones():
    five = 5 * MINUTE
    schedule = Ticked.add_schedule(every=five, start_at=T0, overlap="allow", catchup="none")
    [on_time] = tick_schedules(now=T0 + five + timedelta(seconds=30))
    assert on_time.scheduled_for == T0 + five

    assert tick_schedules(now=T0 + 4 * five + 2 * MINUTE) == []  # the latest tick is two minutes late

    schedule.refresh_from_db()
    assert schedule.next_fire_at == T0 + 5 * five
    assert [e.details for e in events(schedule, "ticks_missed")] == [
        {"first": (T0 + 2 * five).isoformat(), "last": (T0 + 3 * five).isoformat()},
        {"first": (T0 + 4 * five).isoformat(), "last": (T0 + 4 * five).isoformat()},
    ]


def test_jitter_delays_the_start_but_not_the_tick_by_the_same_offset_on_every_host():
    jitter = timedelta(minutes=10)
    schedule = Ticked.add_schedule(every=timedelta(hours=1), start_at=T0, jitter=jitter, name="hourly")
    tick = T0 + timedelta(hours=1)
    offset = schedule.due_at - tick
    assert timedelta(0) < offset < jitter
    assert offset == jitter_offset(jitter, "ticked:hourly", tick)  # a hash of the schedule and the tick

    assert tick_schedules(now=schedule.due_at - timedelta(microseconds=1)) == []
    [wf] = tick_schedules(now=schedule.due_at)

    assert wf.scheduled_for == tick
    schedule.refresh_from_db()
    assert schedule.due_at - schedule.next_fire_at == jitter_offset(jitter, "ticked:hourly", tick + timedelta(hours=1))


def test_a_tick_whose_run_cannot_start_is_recorded_and_the_schedule_goes_on(settings):
    settings.PGBUS_WORKFLOWS = {"MAX_PAYLOAD_SIZE": 4096}
    schedule = every_minute(arguments={"blob": "x" * 3000})
    settings.PGBUS_WORKFLOWS = {"MAX_PAYLOAD_SIZE": 1000}  # lowered after the schedule was added

    assert tick_schedules(now=T0 + MINUTE) == []

    [failed] = events(schedule, "tick_failed")
    assert failed.reason.startswith("PayloadTooLarge") and failed.details == {
        "scheduled_for": (T0 + MINUTE).isoformat()
    }
    schedule.refresh_from_db()
    assert schedule.next_fire_at == T0 + 2 * MINUTE
    assert not WorkflowRun.objects.exists()


# -- operator verbs ---------------------------------------------------------------------------------


class TestOperatorVerbs(WorkflowTestMixin):
    def test_a_paused_schedule_fires_nothing_and_resumes_at_its_next_tick_after_now(self):
        schedule = every_minute()
        schedule_verbs.pause(schedule.pk, actor="alice", reason="maintenance")
        assert self.tick_schedules(now=T0 + 5 * MINUTE) == []
        with pytest.raises(InvalidTransition, match="already paused"):
            schedule_verbs.pause(schedule.pk, actor="alice")

        resumed = schedule_verbs.resume(schedule.pk, actor="bob")

        assert resumed.next_fire_at > datetime.now(UTC) - MINUTE  # the ticks while paused are not caught up
        assert [(e.kind, e.actor, e.reason) for e in schedule.events.exclude(kind="created")] == [
            ("paused", "alice", "maintenance"),
            ("resumed", "bob", ""),
        ]
        with pytest.raises(InvalidTransition, match="is not paused"):
            schedule_verbs.resume(schedule.pk)

    def test_fire_now_starts_a_run_for_this_moment_and_keeps_the_next_tick(self):
        schedule = every_minute(overlap="skip")
        before = datetime.now(UTC) - timedelta(seconds=5)

        wf = schedule_verbs.fire_now(schedule.pk, actor="alice", reason="rerun the report")

        assert wf.scheduled_for > before and wf.record.schedule_id == schedule.pk
        [fired] = events(schedule, "fired_now")
        assert (fired.actor, fired.reason, fired.run_id) == ("alice", "rerun the report", wf.record.pk)
        schedule.refresh_from_db()
        assert schedule.next_fire_at == T0 + MINUTE
        with pytest.raises(InvalidTransition, match="still ongoing and its overlap is 'skip'"):
            schedule_verbs.fire_now(schedule.pk, actor="alice")
        assert WorkflowRun.objects.count() == 1
        assert WorkflowEvent.objects.filter(kind="started", actor="alice").count() == 1


@pytest.mark.django_db(transaction=True)
def test_firing_passes_over_a_schedule_an_operator_holds_and_never_fires_it_once_paused():
    schedule = every_minute(overlap="allow")
    locked, release = threading.Event(), threading.Event()

    def pause_slowly():
        with transaction.atomic():
            paused = schedule_verbs.pause(schedule.pk, actor="alice")
            locked.set()
            # The pause's transaction, and its lock on the schedule, stay open until released:
            # a firer that waited for the lock would only get it once this wait ran out.
            released = release.wait(60)
            return paused, released

    operator = Worker(pause_slowly)
    operator.start()
    assert locked.wait(10)
    assert fire_due(T0 + MINUTE) == []  # passed over: the firer never waits for a lock
    release.set()
    paused, released = operator.finish()
    assert released, "the firer returned only once the operator's lock was gone"
    assert paused.paused
    assert fire_due(T0 + MINUTE) == []  # paused
    assert not WorkflowRun.objects.exists()


def test_the_database_check_reports_schedules_of_a_class_the_code_does_not_define():
    assert "pgbus_workflows.W010" not in database_checks()
    for name, cron in (("nightly", "0 3 * * *"), ("hourly", "0 * * * *")):
        WorkflowSchedule.objects.create(
            workflow_class="from_newer_code", name=name, cron=cron, next_fire_at=T0, due_at=T0
        )

    found = database_checks()["pgbus_workflows.W010"]
    assert "2 schedule(s) of workflow class 'from_newer_code'" in found.msg
    assert "pause or delete" in found.hint
    assert tick_schedules(now=T0 + timedelta(days=400)) == []  # a leader with this code does not fire them


@pytest.mark.django_db(transaction=True)
def test_one_leader_at_a_time_and_the_lead_passes_when_it_resigns():
    schedule = Ticked.add_schedule(every=timedelta(hours=1), start_at=datetime.now(UTC) - timedelta(hours=2))
    stopping = threading.Event()
    first, second = ScheduleLeader("first", stopping), ScheduleLeader("second", stopping)

    assert first.round() <= 1.0 and first.leading
    assert second.round() == STANDBY_INTERVAL and not second.leading
    assert WorkflowRun.objects.filter(schedule=schedule).count() == 1  # the leader fired the latest missed tick
    assert WorkflowSchedule.objects.filter(declared=True).exists()  # and synced the declared schedules

    first.once()  # --once: fires what is due, then lets go of the lead
    assert not first.leading
    second.round()
    assert second.leading
    second.once()
    assert WorkflowRun.objects.filter(schedule=schedule).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_leader_sleeps_until_the_next_tick_not_a_sweep_interval():
    """Why a tick fires in its second whatever ``SWEEP_INTERVAL`` is (the process test runs it with 60 s)."""
    schedule = Ticked.add_schedule(every=timedelta(hours=1))
    due = datetime.now(UTC) + timedelta(milliseconds=600)
    WorkflowSchedule.objects.filter(pk=schedule.pk).update(next_fire_at=due, due_at=due)  # its tick, due soon
    leader = ScheduleLeader("leader", threading.Event())
    wait = leader.round()
    assert leader.leading
    assert not WorkflowRun.objects.exists()
    assert 0 < wait <= 0.6
    leader.once()
