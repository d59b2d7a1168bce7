"""``services.run_hours``: the funnel read from the runs' rollup is the funnel read from the runs.

Runs are made by the engine (finished, cancelled, waiting, ready), then their start and end
times are moved across several hours; the funnel is read from the runs alone (no rollup mark)
and with the rollup, for several windows and moments, and must be the same, also after runs
change status once rolled up. Transactions are real (the rollup waits for every transaction
that could still commit an end, so the test database's wrapping transaction would hold it back).
"""

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from pgbus_workflows.models import WorkflowRollupMark, WorkflowRun, WorkflowRunHour, WorkflowStep
from pgbus_workflows.services import periods, rollups
from pgbus_workflows.services.insights import WINDOWS, class_insights
from pgbus_workflows.services.run_hours import RUN_MARK
from pgbus_workflows.states import TERMINAL_RUN
from tests.services.test_insights import Onboarding, run_all
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)

CLASS = "insights_onboarding"
SETTLED_WITHIN = 120


@pytest.fixture
def history():
    """Twelve runs started 37 minutes apart over the last seven hours: finished, cancelled, waiting, ready."""
    order = Order.objects.create()
    made = [Onboarding.start(order, flaky=n % 3 == 0) for n in range(10)]
    run_all()
    for wf in made[:5]:
        wf.signal("confirmed")
    run_all()
    for wf in made[5:8]:
        wf.cancel("customer left")
    made += [Onboarding.start(order), Onboarding.start(order)]  # ready, their first step not run
    now = timezone.now()
    for i, pk in enumerate(WorkflowRun.objects.order_by("pk").values_list("pk", flat=True)):
        started = now - timedelta(minutes=9 + 37 * i)
        WorkflowRun.objects.filter(pk=pk).update(started_at=started, created_at=started)
        # ended a few minutes after they started, some in the next hour
        WorkflowRun.objects.filter(pk=pk, status__in=sorted(TERMINAL_RUN)).update(
            status_changed_at=started + timedelta(minutes=4 + 11 * (i % 4))
        )
    late = WorkflowRun.objects.filter(status="finished").order_by("-pk").first()
    WorkflowRun.objects.filter(pk=late.pk).update(status_changed_at=now - timedelta(seconds=20))  # after the checkpoint
    return now


def roll_until(moment, now):
    """Run the phase until the runs' rollup has passed ``moment`` (its first call only takes a checkpoint)."""
    deadline = time.monotonic() + SETTLED_WITHIN
    while (rollups.rolled_until(RUN_MARK) or moment) <= moment:
        assert time.monotonic() < deadline, f"the rollup never passed {moment}"
        rollups.roll_up(now)
        time.sleep(0.05)


def funnel(now, window):
    return class_insights(CLASS, WINDOWS[window], now)["funnel"]


def funnel_from_runs(now, window):
    """The funnel read from the runs alone: the runs' mark removed in a transaction rolled back."""
    with transaction.atomic():
        WorkflowRollupMark.objects.filter(name=RUN_MARK).delete()
        found = funnel(now, window)
        transaction.set_rollback(True)
    return found


def moments(now):
    """The fixture's time, times before it (rolled-up runs started after them), times early and late next hour."""
    next_hour = periods.floor_hour(now) + periods.HOUR
    earlier = [now - timedelta(minutes=minutes) for minutes in (3, 20, 50, 100)]
    return [now, *earlier, next_hour, next_hour + timedelta(minutes=10), next_hour + timedelta(minutes=50)]


@pytest.mark.parametrize("window", ["1h", "6h", "24h", "7d"])
def test_the_funnel_read_from_the_rollup_is_the_funnel_read_from_the_runs(history, window):
    now = history
    raw = {at: funnel(at, window) for at in moments(now)}
    assert not WorkflowRollupMark.objects.filter(name=RUN_MARK).exists()

    roll_until(now - timedelta(minutes=2), now)

    assert WorkflowRunHour.objects.filter(workflow_class=CLASS).exists()
    assert {at: funnel(at, window) for at in moments(now)} == raw
    assert raw[now]["started"] > 0


def test_the_rows_count_every_run_ended_before_the_rollups_end(history):
    roll_until(history - timedelta(minutes=2), history)
    until = rollups.rolled_until(RUN_MARK)
    ended = WorkflowRun.objects.filter(status__in=sorted(TERMINAL_RUN), status_changed_at__lt=until)

    assert sum(WorkflowRunHour.objects.values_list("finished", flat=True)) == ended.filter(status="finished").count()
    assert sum(WorkflowRunHour.objects.values_list("cancelled", flat=True)) == ended.filter(status="cancelled").count()
    for row in WorkflowRunHour.objects.all():
        started = ended.filter(started_at__gte=row.hour, started_at__lt=row.hour + periods.HOUR)
        reached = WorkflowStep.objects.filter(run__in=started, step_name=row.step_name).values("run_id").distinct()
        assert row.reached == reached.count()
    assert not ended.filter(status_changed_at__gte=history - timedelta(seconds=30)).exists()  # the late run waits


def test_runs_that_change_status_after_the_rollup_are_counted_where_they_are_now(history):
    """A waiting run finishes, a ready one is cancelled: read from the runs until rolled up, then from the rows."""
    now = history
    roll_until(now - timedelta(minutes=2), now)
    waiting = WorkflowRun.objects.filter(workflow_class=CLASS, status="waiting").order_by("pk")
    ready = WorkflowRun.objects.filter(workflow_class=CLASS, status="ready").order_by("pk")
    assert (waiting.count(), ready.count()) == (2, 2)
    Onboarding.find(ready[0].workflow_id).cancel("changed their mind")
    Onboarding.find(waiting[0].workflow_id).signal("confirmed")
    run_all()  # the signalled run finishes, the other ready run goes on to wait
    assert WorkflowRun.objects.filter(status="waiting").count() == 2
    for window in WINDOWS:
        assert funnel(now, window) == funnel_from_runs(now, window)

    later = timezone.now() + timedelta(minutes=5)
    roll_until(timezone.now(), later)

    assert not WorkflowRun.objects.filter(
        status__in=sorted(TERMINAL_RUN), status_changed_at__gte=rollups.rolled_until(RUN_MARK)
    ).exists()
    for window in WINDOWS:
        for at in moments(now):
            assert funnel(at, window) == funnel_from_runs(at, window)


def test_a_window_retention_reaches_is_read_from_the_runs(history):
    """Rolled-up runs that retention deleted are not counted: the rows would, so the runs are read."""
    now = history
    roll_until(now - timedelta(minutes=2), now)
    rolled = WorkflowRun.objects.filter(status="finished", status_changed_at__lt=rollups.rolled_until(RUN_MARK))
    oldest = rolled.order_by("started_at").first()
    WorkflowRun.objects.filter(pk=oldest.pk).delete()  # as retention would, two hours on

    with override_settings(PGBUS_WORKFLOWS={"RETENTION": timedelta(hours=2)}):
        assert funnel(now, "24h") == funnel_from_runs(now, "24h")
        assert funnel(now, "24h")["started"] == WorkflowRun.objects.filter(workflow_class=CLASS).count()


def test_run_hours_older_than_retention_are_deleted(history):
    roll_until(history - timedelta(minutes=2), history)
    assert WorkflowRunHour.objects.exists()

    rollups.roll_up(history + timedelta(days=30, hours=1, minutes=5), max_seconds=0)

    assert not WorkflowRunHour.objects.filter(hour__lt=history - timedelta(minutes=5)).exists()


def test_a_run_deleted_by_hand_stays_counted_in_its_hours_rows(history):
    """Only retention's deletes are accounted for: a DELETE of one's own leaves the rows as they were."""
    now = history
    roll_until(now - timedelta(minutes=2), now)
    before = funnel(now, "24h")
    rolled = WorkflowRun.objects.filter(status="cancelled", status_changed_at__lt=rollups.rolled_until(RUN_MARK))

    WorkflowRun.objects.filter(pk=rolled.order_by("pk").first().pk).delete()

    assert funnel(now, "24h") == before
    assert funnel_from_runs(now, "24h")["started"] == before["started"] - 1
