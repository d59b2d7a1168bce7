"""``services.rollups``: the sweep's hourly counts, read by insights in place of the attempts.

Runs are made by the engine, their attempts' times moved across several hours; insights are
read before the rollup (every attempt read) and after (whole hours from the rollup, the
window's edges from the attempts): every figure must be the same. Transactions are real (the
rollup waits for the transactions that could still commit an attempt, so the test database's
usual wrapping transaction would hold it back for ever).
"""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.models import WorkflowRollupMark, WorkflowRun, WorkflowStep, WorkflowStepHour
from pgbus_workflows.services import attempt_cells, periods, rollups
from pgbus_workflows.services.insights import WINDOWS, class_insights
from tests.services.test_insights import Onboarding, run_all
from tests.testapp.models import Order
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)

CLASS = "insights_onboarding"
#: Seconds a test waits at most for the rollup to pass an hour (a long transaction in the test
#: database, another thread's, holds every rollup back until it ends).
SETTLED_WITHIN = 120


@pytest.fixture
def history():
    """Six runs whose finished attempts are spread over the last six hours, 23 minutes apart."""
    order = Order.objects.create()
    for n in range(6):
        Onboarding.start(order, flaky=n % 2 == 0)
    run_all()
    now = timezone.now()
    finished = WorkflowStep.objects.filter(finished_at__isnull=False).order_by("pk")
    for i, pk in enumerate(finished.values_list("pk", flat=True)):
        end = now - timedelta(minutes=7 + 23 * i)
        WorkflowStep.objects.filter(pk=pk).update(finished_at=end, started_at=end - timedelta(seconds=0.3 * (i + 1)))
    return now


def roll_until(hour, now):
    """Run the phase until the rollup has passed ``hour`` (its first call only takes a checkpoint)."""
    deadline = time.monotonic() + SETTLED_WITHIN
    while (rollups.rolled_until() or hour) <= hour or rollups.rolled_until() is None:
        assert time.monotonic() < deadline, f"the rollup never passed {hour}"
        rollups.roll_up(now)
        time.sleep(0.05)


def figures(now, window="24h"):
    found = class_insights(CLASS, WINDOWS[window], now)
    return found["performance"], found["pipeline"], found["funnel"]


@pytest.mark.parametrize("window", ["1h", "6h", "24h"])
def test_insights_read_from_the_rollup_are_those_read_from_the_attempts(history, window):
    """The window's start on an hour, early in one (the part before taken off), late in one (the rest added)."""
    now = history
    raw = figures(now, window)
    assert WorkflowRollupMark.objects.count() == 0

    roll_until(periods.floor_hour(now - rollups.SETTLE) - periods.HOUR, now)

    assert WorkflowStepHour.objects.filter(workflow_class=CLASS).exists()
    assert figures(now, window) == raw
    next_hour = periods.floor_hour(now) + periods.HOUR
    moments = [next_hour, next_hour + timedelta(minutes=10), next_hour + timedelta(minutes=50)]
    with_rollup = [figures(at, window) for at in moments]
    WorkflowRollupMark.objects.all().delete()
    assert [figures(at, window) for at in moments] == with_rollup


def test_the_hours_rolled_up_count_every_attempt_finished_in_them(history):
    roll_until(periods.floor_hour(history - rollups.SETTLE) - periods.HOUR, history)
    until = rollups.rolled_until()

    rolled = sum(WorkflowStepHour.objects.values_list("attempts", flat=True))

    assert rolled == WorkflowStep.objects.filter(finished_at__lt=until).count() > 0
    for row in WorkflowStepHour.objects.all():
        ended = WorkflowStep.objects.filter(
            run__workflow_class=row.workflow_class,
            step_name=row.step_name,
            finished_at__gte=row.hour,
            finished_at__lt=row.hour + periods.HOUR,
        )
        assert row.attempts == ended.count()
        assert row.failed == ended.filter(status="failed").count()
        assert row.reattempts == ended.filter(attempt__gt=1).count()
        assert sum(row.durations.values()) == ended.count()


def test_an_outcome_that_commits_late_is_rolled_up(history):
    """A transaction open at a checkpoint holds the rollup back until it ends: its attempt is counted."""
    now = history
    late_hour = periods.floor_hour(now - rollups.SETTLE) - periods.HOUR
    run = WorkflowRun.objects.order_by("pk").first()
    locked, release = threading.Event(), threading.Event()

    def outcome():
        with transaction.atomic():
            WorkflowRun.objects.select_for_update().get(pk=run.pk)  # the run's lock: a transaction id
            locked.set()
            assert release.wait(60)
            WorkflowStep.objects.filter(run_id=run.pk, step_name="confirm").update(
                status="completed", started_at=late_hour, finished_at=late_hour + timedelta(minutes=1)
            )

    worker = Worker(outcome)
    worker.start()
    assert locked.wait(30)
    for _ in range(4):  # the first takes a checkpoint, which the open transaction holds back
        rollups.roll_up(now)
        assert rollups.rolled_until() is None
    release.set()
    worker.finish()

    roll_until(late_hour, now)

    row = WorkflowStepHour.objects.get(workflow_class=CLASS, step_name="confirm", hour=late_hour)
    assert (row.attempts, row.completed) == (1, 1)
    assert figures(now)[0] == figures_from_attempts(now)


def test_the_hour_going_on_is_added_to_sweep_by_sweep(history):
    """Attempts of an hour rolled up in part are added to its rows once, at a later checkpoint."""
    now = history
    roll_until(periods.floor_hour(now - rollups.SETTLE) - periods.HOUR, now)
    before = {(r.step_name, r.hour): r.attempts for r in WorkflowStepHour.objects.all()}
    hour = periods.floor_hour(rollups.rolled_until())
    later = rollups.rolled_until() + timedelta(seconds=30)
    WorkflowStep.objects.filter(step_name="confirm").update(
        status="completed", started_at=later - timedelta(seconds=2), finished_at=later
    )

    roll_until(rollups.rolled_until(), now + timedelta(minutes=5))

    confirmed = WorkflowStep.objects.filter(step_name="confirm").count()
    assert WorkflowStepHour.objects.get(step_name="confirm", hour=periods.floor_hour(later)).attempts == confirmed
    after = {(r.step_name, r.hour): r.attempts for r in WorkflowStepHour.objects.exclude(step_name="confirm")}
    assert after == {key: n for key, n in before.items() if key[0] != "confirm"}
    assert hour <= periods.floor_hour(later)


def figures_from_attempts(now):
    WorkflowRollupMark.objects.update(rolled_until=None)
    return figures(now)[0]


def test_hours_older_than_retention_are_deleted(history):
    roll_until(periods.floor_hour(history - rollups.SETTLE) - periods.HOUR, history)
    assert WorkflowStepHour.objects.exists()

    rollups.roll_up(history + timedelta(days=30, hours=1, minutes=5), max_seconds=0)

    assert not WorkflowStepHour.objects.filter(hour__lt=history - timedelta(minutes=5)).exists()


def test_the_sweep_runs_the_rollup_phase(history):
    summary = Sweeper().run()

    assert "rollups" in summary and "failed" not in summary
    assert WorkflowRollupMark.objects.get(name=rollups.MARK).checkpoint_at is not None


@pytest.mark.parametrize("seconds", [0.0005, 0.001, 0.0123, 1.0, 2.5, 61.0, 86400.0])
def test_a_duration_falls_in_the_bucket_whose_bounds_hold_it(seconds):
    low, high = attempt_cells.bucket_bounds(attempt_cells.bucket(seconds))

    assert low <= seconds < high
    assert low == 0 or high / low == pytest.approx(2 ** (1 / attempt_cells.BUCKETS_PER_DOUBLING))


def test_the_dashboards_last_hour_read_from_the_rollup_is_read_from_the_attempts(history):
    from django.contrib import admin

    from pgbus_workflows.admin.dashboard import _recent_steps

    now = history
    moments = [now, now + timedelta(minutes=20), now + timedelta(minutes=50), now + timedelta(minutes=80)]
    raw = [_recent_steps(admin.site, at) for at in moments]
    assert sum(cell["count"] for cell in raw[0]["totals"]) > 0

    roll_until(periods.floor_hour(now - rollups.SETTLE) - periods.HOUR, now)

    assert [_recent_steps(admin.site, at) for at in moments] == raw


def test_insights_reads_of_attempts_and_runs_are_never_jit_compiled(history, executed_plans):
    # Their estimates pass jit_above_cost behind a busy hour: compiling one took 190 ms, where
    # reading its 80,000 attempts took 160 ms (docs/benchmarks.md, "Tens of millions of rows").
    executed_plans.clear()
    figures(history, "24h")

    by_hour = [plan for plan in executed_plans if "DATE_TRUNC" in plan.split("\n")[1]]  # its query text
    reads = [plan for plan in by_hour if "pgbus_workflows_workflowstep" in plan]
    assert len(reads) >= 2, executed_plans  # the attempts at the window's edge, the funnel's steps
    assert all("jit = 'off'" in plan for plan in reads), [p[:900] for p in reads if "jit = 'off'" not in p]
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "on"  # each read's transaction's own setting
