"""Schedules fired by real ``run_workflow_dispatcher`` processes: on time, by one leader, never twice.

An every-second schedule with ``catchup="all"``: every tick from the first to the last must
have exactly one run, whichever dispatcher fired it, through a SIGKILL of the leader while
its tick's transaction is open.
"""

import signal
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowRun
from tests.procs import database_url, eventually
from tests.support import sessions_waiting_for_a_lock
from tests.testapp.workflows import Ticked

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SECOND = timedelta(seconds=1)
#: A long sweep interval: ticks must not wait for the sweep.
SETTINGS = {"SWEEP_INTERVAL": 60, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 3, "POLL_INTERVAL": 0.2}
#: The statement of a tick (the leader inserting its run), as pg_stat_activity shows it.
RUN_INSERT = 'INSERT INTO "pgbus_workflows_workflowrun"'


def every_second():
    return Ticked.add_schedule(every=SECOND, overlap="allow", catchup="all", start_at=datetime.now(UTC))


def ticks():
    return sorted(WorkflowRun.objects.filter(schedule__isnull=False).values_list("scheduled_for", flat=True))


def assert_each_tick_once_and_none_lost(fired):
    assert fired, "no tick fired"
    assert len(set(fired)) == len(fired)
    assert fired == [fired[0] + n * SECOND for n in range(len(fired))], "a tick is missing"
    runs = WorkflowRun.objects.filter(schedule__isnull=False)
    assert WorkflowEvent.objects.filter(kind="started", run__in=runs).count() == len(fired)


def leads(process):
    return "Schedules: " in process.output() and " leads" in process.output()


def steady_ticks():
    """The runs of ticks due after the first run was made: past the start-up, whose ticks may be caught up at once."""
    runs = list(WorkflowRun.objects.filter(schedule__isnull=False).order_by("scheduled_for"))
    return [run for run in runs if run.scheduled_for > runs[0].created_at + SECOND] if runs else []


def test_the_leader_fires_each_tick_at_its_time_in_order_with_a_long_sweep_interval(dispatchers):
    """Each tick once, in order, none lost and none early.

    How late a tick may be on a loaded machine is not asserted here: the leader sleeps until
    the next tick whatever ``SWEEP_INTERVAL`` is (``test_schedules.py``), and
    ``bench.schedules`` measures the lateness.
    """
    every_second()
    process = dispatchers("--concurrency", "2", settings=SETTINGS)
    # Five ticks past the start-up, however long the start-up took on a loaded machine.
    eventually(lambda: len(steady_ticks()) >= 5, timeout=60, what="five ticks past the start-up")
    process.send(signal.SIGTERM)
    assert process.wait() == 0, process.output()

    runs = list(WorkflowRun.objects.filter(schedule__isnull=False).order_by("scheduled_for"))
    assert_each_tick_once_and_none_lost([run.scheduled_for for run in runs])
    # Past the start-up, each fired at or after its time.
    steady = steady_ticks()
    assert len(steady) >= 5
    assert all(run.created_at >= run.scheduled_for for run in steady)


def test_two_dispatchers_and_a_sigkill_of_the_leader_mid_tick_fire_no_tick_twice_and_lose_none(dispatchers):
    every_second()
    first = dispatchers("--concurrency", "2", settings=SETTINGS)
    eventually(lambda: leads(first), timeout=60, what="the first dispatcher to lead")
    second = dispatchers("--concurrency", "2", settings=SETTINGS)
    eventually(lambda: "Dispatcher" in second.output() and "started" in second.output(), timeout=60)
    eventually(lambda: len(ticks()) >= 3, timeout=30, what="three ticks")
    assert not leads(second), "two leaders at once"

    url = database_url()
    with psycopg.connect(url) as blocker:
        # Hold the events table: the leader's next tick inserts its run and waits, its transaction open.
        blocker.execute('LOCK TABLE "pgbus_workflows_workflowevent" IN SHARE MODE')
        with psycopg.connect(url, autocommit=True) as observer:
            eventually(
                lambda: sessions_waiting_for_a_lock(RUN_INSERT, observer), timeout=30, what="the leader mid-tick"
            )
        before = ticks()
        first.kill()  # SIGKILL: its lock connection closes, its open tick is never committed
        eventually(lambda: leads(second), timeout=30, what="the second dispatcher to take the lead")
        blocker.rollback()

    eventually(lambda: len(ticks()) >= len(before) + 5, timeout=30, what="ticks after the takeover")
    restarted = dispatchers("--concurrency", "2", settings=SETTINGS)  # back as a standby
    # Its listener holds its liveness lock: it is up, a standby beside the leader.
    standing_by = Dispatcher.objects.filter(pid=restarted.proc.pid, session_lock=True)
    eventually(standing_by.exists, timeout=60, what="the restarted dispatcher to stand by")
    second.send(signal.SIGTERM)
    assert second.wait() == 0, second.output()
    eventually(lambda: leads(restarted), timeout=30, what="the restarted dispatcher to lead")
    count = len(ticks())
    eventually(lambda: len(ticks()) >= count + 2, timeout=30, what="ticks by the third leader")
    restarted.send(signal.SIGTERM)
    assert restarted.wait() == 0, restarted.output()

    fired = ticks()
    assert_each_tick_once_and_none_lost(fired)
    assert fired[len(before)] == before[-1] + SECOND  # the tick the killed leader had open fired once, later


def test_once_fires_what_is_due_and_no_schedules_fires_nothing(dispatchers):
    start = datetime.now(UTC) - timedelta(minutes=10)
    schedule = Ticked.add_schedule(every=timedelta(minutes=1), start_at=start)  # catchup="latest"

    worker = dispatchers("--once", "--no-schedules", settings=SETTINGS)
    assert worker.wait() == 0, worker.output()
    assert ticks() == []

    before = datetime.now(UTC)
    once = dispatchers("--once", settings=SETTINGS)
    assert once.wait() == 0, once.output()
    [run] = WorkflowRun.objects.filter(schedule=schedule)
    assert run.scheduled_for > before - timedelta(minutes=1)  # only the latest missed tick
    assert run.status == "finished"  # --once fires before it drains: the run's step ran too
    assert schedule.events.filter(kind="ticks_missed").count() == 1
