"""Schedules that cannot work: refused when declared, recorded when they fail, never blocking the others.

A declared schedule that could never be stored is a ``ConfigurationError`` of its class; one
that fails when it fires is recorded on its row (``last_error``, a ``tick_failed`` event, a
metric) while the other schedules fire on; re-enabling counts from now; a previous run held
by another transaction never holds up the leader; and the audit trail follows ``RETENTION``.
"""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from pgbus_workflows import ConfigurationError, InvalidTransition, Schedule, Workflow, metrics, step
from pgbus_workflows.dispatcher.scheduler import ScheduleLeader
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.models import ScheduleEvent, WorkflowRun, WorkflowSchedule
from pgbus_workflows.services import schedules as schedule_verbs
from pgbus_workflows.services.firing import RETRY_AFTER, fire_due
from pgbus_workflows.testing import tick_schedules
from tests.testapp.workflows import Ticked, YearlyReport
from tests.threads import Worker

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def every_minute(**options):
    """A Ticked schedule every minute whose first tick is T0 + 1 minute."""
    return Ticked.add_schedule(every=MINUTE, start_at=T0, **options)


# -- refused when declared ------------------------------------------------------------------------


@pytest.mark.parametrize("arguments", [{"ids": {1, 2}}, {"ratio": float("nan")}, {"when": object()}])
def test_a_declared_schedule_whose_arguments_are_not_json_is_refused_when_the_class_is_defined(arguments):
    with pytest.raises(ConfigurationError, match=r"NotJson.schedules 'nightly': arguments must be JSON-serialisable"):

        class NotJson(Workflow):
            schedules = [Schedule(cron="0 3 * * *", name="nightly", arguments=arguments)]

            @step
            def one(self):
                pass


def test_schedules_declared_on_an_abstract_class_are_refused_it_is_never_registered_so_never_fired():
    with pytest.raises(ConfigurationError, match="AbstractNightly is abstract: declare its schedules on a subclass"):

        class AbstractNightly(Workflow):
            abstract = True
            schedules = [Schedule(cron="0 3 * * *")]


# -- a failure is recorded on its schedule, the others fire --------------------------------------


@pytest.mark.django_db
def test_a_declaration_the_sync_cannot_store_is_recorded_on_its_row_and_the_other_schedules_fire(monkeypatch):
    schedule_verbs.sync_declared(T0)
    yearly = WorkflowSchedule.objects.get(workflow_class="yearly_report", name="cron 0 3 1 1 *")
    unstorable = Schedule(cron="0 3 1 1 *", timezone="Europe/Paris", name="cron 0 3 1 1 *", arguments={"n": "a\x00"})
    leap = YearlyReport.schedules[1]
    monkeypatch.setattr(YearlyReport, "schedules", [unstorable, leap])  # JSON, but PostgreSQL refuses a NUL
    good = every_minute(name="good")

    assert schedule_verbs.sync_declared(T0) == {"created": 0, "changed": 0, "deleted": 0, "failed": 1}
    [run] = tick_schedules(now=T0 + MINUTE)

    assert run.record.schedule_id == good.pk
    yearly.refresh_from_db()
    assert yearly.last_error.startswith("PayloadNotSerializable: yearly_report schedule 'cron 0 3 1 1 *' arguments")
    assert yearly.last_error_at == T0 + MINUTE and yearly.arguments == {"kind": "yearly"}  # the row as it was


@pytest.mark.django_db
def test_a_class_whose_schedules_no_longer_pass_its_checks_keeps_its_rows_and_the_others_fire(monkeypatch):
    schedule_verbs.sync_declared(T0)
    broken = Schedule(cron="0 3 1 1 *", timezone="Europe/Paris", name="cron 0 3 1 1 *")
    object.__setattr__(broken, "arguments", {"ids": {1, 2}})  # changed after the class was defined
    monkeypatch.setattr(YearlyReport, "schedules", [broken])
    good = every_minute(name="good")

    assert schedule_verbs.sync_declared(T0) == {"created": 0, "changed": 0, "deleted": 0, "failed": 1}
    [run] = tick_schedules(now=T0 + MINUTE)

    assert run.record.schedule_id == good.pk
    rows = WorkflowSchedule.objects.filter(workflow_class="yearly_report")
    assert rows.count() == 2  # not deleted as "no longer declared"
    assert all("arguments must be JSON-serialisable" in row.last_error for row in rows)


@pytest.mark.django_db
def test_a_tick_that_fails_is_recorded_on_its_schedule_counted_and_cleared_once_a_tick_starts(
    settings, django_capture_on_commit_callbacks
):
    metrics.install()
    settings.PGBUS_WORKFLOWS = {"MAX_PAYLOAD_SIZE": 4096}
    broken = every_minute(name="broken", arguments={"blob": "x" * 3000})
    good = every_minute(name="good")
    settings.PGBUS_WORKFLOWS = {"MAX_PAYLOAD_SIZE": 1000}  # lowered after the schedule was added
    failures = metrics.SCHEDULE_FAILURES._value.get()

    with django_capture_on_commit_callbacks(execute=True):
        [run] = fire_due(T0 + MINUTE)

    assert run.record.schedule_id == good.pk
    broken.refresh_from_db()
    assert broken.last_error.startswith("PayloadTooLarge: ticked arguments is")
    assert broken.last_error_at == T0 + MINUTE
    assert ScheduleEvent.objects.filter(schedule=broken, kind="tick_failed").count() == 1
    assert metrics.SCHEDULE_FAILURES._value.get() == failures + 1

    settings.PGBUS_WORKFLOWS = {"MAX_PAYLOAD_SIZE": 4096}
    runs = fire_due(T0 + 2 * MINUTE)
    assert [wf.record.schedule_id for wf in runs] == [broken.pk]  # good's first run is still ongoing: skipped
    broken.refresh_from_db()
    assert (broken.last_error, broken.last_error_at) == ("", None)


@pytest.mark.django_db
def test_a_row_whose_next_tick_cannot_be_computed_is_tried_again_later_and_the_others_fire():
    bad = WorkflowSchedule.objects.create(
        workflow_class="ticked", name="by hand", cron="not a cron at all", next_fire_at=T0, due_at=T0
    )
    good = every_minute(name="good")

    [run] = fire_due(T0 + MINUTE)

    assert run.record.schedule_id == good.pk
    bad.refresh_from_db()
    assert bad.last_error and bad.due_at == T0 + MINUTE + RETRY_AFTER


@pytest.mark.django_db(transaction=True)
def test_the_leader_fires_the_stored_schedules_when_syncing_the_declared_ones_fails(monkeypatch):
    def broken_sync():
        raise TypeError("Object of type set is not JSON serializable")

    monkeypatch.setattr("pgbus_workflows.dispatcher.scheduler.sync_declared", broken_sync)
    schedule = Ticked.add_schedule(every=HOUR, start_at=datetime.now(UTC) - 2 * HOUR)
    leader = ScheduleLeader("leader", threading.Event())
    try:
        leader.round()
        assert leader.leading
        assert WorkflowRun.objects.filter(schedule=schedule).count() == 1
    finally:
        leader._resign()


# -- re-enabling counts from now ------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("catchup", ["all", "latest"])
def test_re_enabling_a_declared_schedule_counts_from_now_and_fires_nothing_of_the_disabled_period(monkeypatch, catchup):
    hourly = {"every": HOUR, "name": "hourly", "catchup": catchup}
    monkeypatch.setattr(YearlyReport, "schedules", [Schedule(**hourly, enabled=False)])
    schedule_verbs.sync_declared(T0 - timedelta(days=10))
    monkeypatch.setattr(YearlyReport, "schedules", [Schedule(**hourly)])

    assert tick_schedules(now=T0) == []

    row = WorkflowSchedule.objects.get(workflow_class="yearly_report", name="hourly")
    assert (row.enabled, row.next_fire_at) == (True, T0 + HOUR)
    assert not row.events.filter(kind="ticks_missed").exists()
    [run] = tick_schedules(now=T0 + HOUR)
    assert run.scheduled_for == T0 + HOUR


# -- a held previous run never holds up the leader ------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cancel_previous_never_waits_for_a_held_run_and_cancels_it_once_it_is_free():
    cancelling = every_minute(name="cancelling", overlap="cancel_previous")
    [previous] = fire_due(T0 + MINUTE)
    unrelated = Ticked.add_schedule(every=MINUTE, start_at=T0 + MINUTE, name="unrelated")
    locked, release = threading.Event(), threading.Event()

    def hold_the_run():
        with transaction.atomic():
            WorkflowRun.objects.select_for_update().get(pk=previous.record.pk)
            locked.set()
            # A firer that waited for this lock would only get it once this wait ran out.
            return release.wait(60)

    holder = Worker(hold_the_run)
    holder.start()
    try:
        assert locked.wait(30)
        [fired] = fire_due(T0 + 2 * MINUTE)
        assert fired.record.schedule_id == unrelated.pk
        cancelling.refresh_from_db()
        assert cancelling.due_at == T0 + 2 * MINUTE  # left due: it fires at a later round
        assert previous.reload().status == "ready"
        with pytest.raises(InvalidTransition, match="is held by another transaction; try again in a moment"):
            schedule_verbs.fire_now(cancelling.pk, actor="carla")  # the operator's fire now does not wait either
    finally:
        release.set()
        released = holder.finish()
    assert released, "the firing waited for the held run's lock"

    [second] = fire_due(T0 + 2 * MINUTE)

    assert second.record.schedule_id == cancelling.pk and second.scheduled_for == T0 + 2 * MINUTE
    assert previous.reload().status == "cancelled"


# -- retention ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_sweep_deletes_schedule_events_older_than_retention_in_bounded_batches(settings):
    settings.PGBUS_WORKFLOWS = {"RETENTION": timedelta(days=30)}
    schedule = every_minute(name="skipping")
    now = datetime.now(UTC)
    old = [
        ScheduleEvent.objects.create(schedule=schedule, kind="tick_skipped", created_at=now - timedelta(days=31))
        for _ in range(5)
    ]
    recent = ScheduleEvent.objects.create(schedule=schedule, kind="tick_skipped", created_at=now - timedelta(days=29))

    assert schedule_verbs.delete_expired_schedule_events(now, batch_size=2, max_batches=1) == 2
    summary = Sweeper().run(now, force_cleanup=True)

    assert summary["schedule_events"] == 3
    assert not ScheduleEvent.objects.filter(pk__in=[e.pk for e in old]).exists()
    assert ScheduleEvent.objects.filter(pk=recent.pk).exists()
    assert schedule.events.filter(kind="created").exists()  # written now: kept


@pytest.mark.django_db
def test_no_retention_keeps_every_schedule_event(settings):
    settings.PGBUS_WORKFLOWS = {"RETENTION": None}
    schedule = every_minute(name="kept")
    ScheduleEvent.objects.create(schedule=schedule, kind="tick_skipped", created_at=T0 - timedelta(days=3650))

    assert schedule_verbs.delete_expired_schedule_events(datetime.now(UTC)) == 0
    assert schedule.events.count() == 2
