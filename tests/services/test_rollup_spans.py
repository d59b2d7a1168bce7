"""The rollups' five-minute spans: a window's start read from them, their start after an upgrade, their expiry.

The same histories as ``test_rollups`` (attempts spread over six hours) and ``test_run_hours``
(runs started over seven): insights read with the rollup, at moments that put the window's
start early, halfway and late in its span, must be insights read from the attempts and runs.
"""

import threading
import time
from datetime import timedelta

import pytest
from django.test import override_settings

from pgbus_workflows.models import WorkflowRollupMark, WorkflowRunSpan, WorkflowStep, WorkflowStepSpan
from pgbus_workflows.services import periods, rollups
from pgbus_workflows.services.insights import WINDOWS
from pgbus_workflows.services.run_hours import RUN_MARK
from tests.services.test_rollups import figures, history, roll_until  # noqa: F401 (a fixture)
from tests.services.test_run_hours import funnel, funnel_from_runs
from tests.services.test_run_hours import history as run_history  # noqa: F401 (a fixture)
from tests.services.test_run_hours import roll_until as roll_runs_until
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)

CLASS = "insights_onboarding"


def span_moments(now):
    """Moments next hour whose windows start 0, 1, 2.5, 4 and 4.9 minutes into a span, in its first and last spans."""
    next_hour = periods.floor_hour(now) + periods.HOUR
    offsets = [0, 1, 2.5, 4, 4.9, 31, 57.5, 59.9]
    return [next_hour + timedelta(minutes=minutes) for minutes in offsets]


def raw_figures(moments, window):
    """Insights read from the attempts and runs alone: both marks moved back, then put back."""
    marks = list(WorkflowRollupMark.objects.values())
    WorkflowRollupMark.objects.update(rolled_until=None)
    found = [figures(at, window) for at in moments]
    for mark in marks:
        WorkflowRollupMark.objects.filter(name=mark["name"]).update(rolled_until=mark["rolled_until"])
    return found


@pytest.mark.parametrize("window", ["1h", "6h", "24h"])
def test_a_windows_start_read_from_the_spans_is_read_from_the_attempts(history, window):  # noqa: F811
    now = history
    roll_until(periods.floor_hour(now - rollups.SETTLE) - periods.HOUR, now)
    assert WorkflowStepSpan.objects.exists()
    moments = span_moments(now)

    assert [figures(at, window) for at in moments] == raw_figures(moments, window)


def test_the_spans_are_what_the_window_start_reads(history):  # noqa: F811
    """Emptied, with their mark left, they change the figures: the start is not read from the attempts.

    An attempt ends at 12:30 past an hour; the window starts at 14:59 past it, so the spans from
    the hour to 15:00 are taken off the hour, that attempt's among them.
    """
    now = history
    ended = periods.floor_hour(now) - 2 * periods.HOUR + timedelta(minutes=12, seconds=30)
    WorkflowStep.objects.filter(pk=WorkflowStep.objects.filter(finished_at__isnull=False).order_by("pk")[0].pk).update(
        started_at=ended - timedelta(seconds=1), finished_at=ended
    )
    roll_until(periods.floor_hour(now - rollups.SETTLE) - periods.HOUR, now)
    since = ended + timedelta(minutes=2, seconds=29)
    start = periods.window_start(since, rollups.rolled_until(), rollups.reach(rollups.MARK)[1])
    assert (start.hour, start.spans()) == (periods.floor_hour(ended), (start.hour, start.hour + 2 * periods.SPAN, -1))
    with_spans = figures(since + WINDOWS["6h"], "6h")[0]

    WorkflowStepSpan.objects.all().delete()

    assert figures(since + WINDOWS["6h"], "6h")[0] != with_spans


def test_after_an_upgrade_the_spans_begin_at_the_next_span(history):  # noqa: F811
    """Hours rolled up before the spans existed: windows starting before the spans read their edge from the attempts."""
    now = history
    roll_until(periods.floor_hour(now - rollups.SETTLE) - periods.HOUR, now)
    WorkflowStepSpan.objects.all().delete()
    WorkflowRunSpan.objects.all().delete()
    WorkflowRollupMark.objects.update(spans_from=None)  # as migration 0028 leaves a mark
    moments = span_moments(now)
    before = raw_figures(moments, "1h")
    assert [figures(at, "1h") for at in moments] == before
    upgraded_at = rollups.rolled_until()
    later = upgraded_at + timedelta(minutes=7)  # a waiting attempt ends after the upgrade
    confirmed = WorkflowStep.objects.filter(step_name="confirm", finished_at__isnull=True).order_by("pk").first()
    WorkflowStep.objects.filter(pk=confirmed.pk).update(
        status="completed", started_at=later - timedelta(seconds=3), finished_at=later
    )

    roll_until(later, now + timedelta(minutes=30))

    assert rollups.reach(rollups.MARK)[1] == periods.ceil_span(upgraded_at)
    assert not WorkflowStepSpan.objects.filter(start__lt=periods.ceil_span(upgraded_at)).exists()
    assert WorkflowStepSpan.objects.get(step_name="confirm", start=periods.floor_span(later)).attempts == 1
    assert [figures(at, "1h") for at in moments] == raw_figures(moments, "1h")


def test_spans_older_than_they_are_kept_are_deleted(history):  # noqa: F811
    roll_until(periods.floor_hour(history - rollups.SETTLE) - periods.HOUR, history)
    oldest = WorkflowStepSpan.objects.order_by("start").first().start

    rollups.roll_up(oldest + periods.SPANS_KEPT + timedelta(minutes=20), max_seconds=0)

    expired = periods.floor_span(oldest + timedelta(minutes=20))
    assert WorkflowStepSpan.objects.exists()
    assert not WorkflowStepSpan.objects.filter(start__lt=expired).exists()
    assert rollups.reach(rollups.MARK)[1] == expired


def test_no_span_outlives_its_hour_under_a_short_retention(history):  # noqa: F811
    """Hours go after ``RETENTION`` and an hour; the spans of those hours go with them; windows read the rest."""
    now = history
    roll_until(periods.floor_hour(now - rollups.SETTLE) - periods.HOUR, now)

    with override_settings(PGBUS_WORKFLOWS={"RETENTION": timedelta(hours=1)}):
        rollups.roll_up(now, max_seconds=0)
        hours_from = now - timedelta(hours=2)
        assert not WorkflowStepSpan.objects.filter(start__lt=hours_from).exists()
        assert rollups.reach(rollups.MARK)[1] >= hours_from
        moments = span_moments(now)
        assert [figures(at, "1h") for at in moments] == raw_figures(moments, "1h")


@pytest.mark.parametrize("window", ["1h", "6h"])
def test_the_funnels_start_read_from_the_run_spans_is_read_from_the_runs(run_history, window):  # noqa: F811
    now = run_history
    roll_runs_until(now - timedelta(minutes=2), now)
    assert WorkflowRunSpan.objects.exists()
    moments = [*span_moments(now), *(now - timedelta(minutes=m) for m in (1, 3.5, 62, 64.5))]

    assert [funnel(at, window) for at in moments] == [funnel_from_runs(at, window) for at in moments]
    assert rollups.reach(RUN_MARK)[1] is not None
    assert max(WINDOWS.values()) + periods.HOUR <= periods.SPANS_KEPT


def test_a_read_while_the_sweep_rolls_up_counts_every_attempt_once(history):  # noqa: F811
    """The sweep commits its rows and its mark together between a read's statements: the read goes again."""
    now = history
    window = (now - timedelta(hours=7), now)
    expected = rollups.window_cells(CLASS, *window)  # no mark yet: read from the attempts
    rollups.roll_up(now - timedelta(hours=7))  # the first checkpoint
    stop = threading.Event()

    def sweeps():
        moment = now - timedelta(hours=7)
        while not stop.is_set() and moment < now:
            moment += timedelta(minutes=5)
            rollups.roll_up(moment, max_seconds=0)
            time.sleep(0.01)  # sweeps seconds apart, not back to back: a read that goes again gets through

    sweeper = Worker(sweeps)
    sweeper.start()
    reads = []
    while sweeper.is_alive():
        reads.append(rollups.window_cells(CLASS, *window))
    stop.set()
    sweeper.finish()

    assert rollups.rolled_until() > now - timedelta(hours=1)  # through the history (a held checkpoint lags a step)
    assert len(reads) >= 10
    assert all(read == expected for read in reads), sum(read != expected for read in reads)
