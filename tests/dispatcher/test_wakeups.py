"""Several dispatchers and one NOTIFY: the first of a group claims at once, the others a moment later.

A trickle of runs then goes to one dispatcher, whose outcomes batch together, and the others
spend almost nothing; work the first cannot take (its slots are full) is still taken by
another within its delay.
"""

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone
from psycopg import sql as psql

from pgbus_workflows.conf import settings
from pgbus_workflows.dispatcher import WorkflowDispatcher
from pgbus_workflows.dispatcher.wakeups import FOLLOW_MAX, FOLLOW_MIN, Wakeups, dispatchers_channel
from pgbus_workflows.dsl.deploy import catalog
from pgbus_workflows.models import Dispatcher, WorkflowStep
from pgbus_workflows.services.claims import claim_and_look_ahead
from pgbus_workflows.sql.session import connection_params
from tests.procs import DispatcherProcess, eventually
from tests.testapp.models import SideEffect
from tests.testapp.workflows import NoOp3, Slow

pytestmark = pytest.mark.django_db(transaction=True)


def dispatcher_row(name, *, queues=(), alive=4, beat_ago=0.0, code=None):
    return Dispatcher.objects.create(
        name=name,
        hostname="h",
        pid=1,
        queues=sorted(queues),
        concurrency=4,
        workers_alive=alive,
        catalog=catalog() if code is None else code,
        heartbeat_at=timezone.now() - timedelta(seconds=beat_ago),
    )


def elected(name, queues=None):
    wakeups = Wakeups(name, frozenset(queues) if queues else None)
    wakeups.elect()
    return wakeups.first


def test_the_first_of_a_group_by_name_claims_at_once_and_the_others_follow():
    dispatcher_row("b")
    dispatcher_row("c")
    assert elected("b") and not elected("c")
    dispatcher_row("a", beat_ago=3600)  # taken for dead: not of the group
    dispatcher_row("a0", alive=0)  # sweeps only: no workers to claim with
    assert elected("b")


def test_other_queues_or_other_code_make_another_group():
    dispatcher_row("a", queues=["mail"])
    dispatcher_row("b", code={"only_newer_code_knows": ["step"]})  # a rolling deploy: the new code
    dispatcher_row("c")
    assert elected("c")  # a and b are each the first of a group of their own
    assert elected("a", ["mail"])
    assert not elected("d")  # c is the first of this one


def test_a_followers_delay_grows_while_it_finds_nothing_and_falls_back_when_it_finds_work():
    dispatcher_row("a")
    dispatcher_row("b")
    follower = Wakeups("b", None)
    follower.elect()
    assert follower.deferral() == FOLLOW_MIN
    for _ in range(10):
        follower.claimed(0)
    assert follower.deferral() == FOLLOW_MAX
    follower.claimed(3)
    assert follower.deferral() == FOLLOW_MIN
    first = Wakeups("a", None)
    first.elect()
    first.claimed(0)
    assert first.deferral() == 0.0


def test_a_follower_leaves_the_first_what_it_takes_at_once():
    fresh, stale = NoOp3.start(), NoOp3.start()
    WorkflowStep.objects.filter(run_id=stale.record.pk).update(scheduled_at=timezone.now() - timedelta(seconds=5))

    steps, _ = claim_and_look_ahead(10, claimed_by="follower", due_for=timedelta(seconds=1))

    assert [s.run_id for s in steps] == [stale.record.pk]
    assert WorkflowStep.objects.get(run_id=fresh.record.pk).status == "scheduled"


@pytest.fixture
def two_dispatchers():
    """Two real dispatchers of one group (concurrency 1 each), once both elected: (first, follower) names."""
    processes = [DispatcherProcess("--no-sweep", "--concurrency", "1") for _ in range(2)]
    try:
        eventually(
            lambda: Dispatcher.objects.filter(workers_alive__gt=0).count() == 2, what="both dispatchers registered"
        )
        first, follower = sorted(Dispatcher.objects.values_list("name", flat=True))
        # The first of a group never follows: once the other follows it, both are elected.
        follows = f"Dispatcher {follower} now follows {first}"
        eventually(lambda: any(follows in p.output() for p in processes), what="the follower to follow")
        yield first, follower
    finally:
        for process in processes:
            process.stop()


@pytest.mark.processes
def test_a_trickle_goes_to_the_first_dispatcher_of_the_group(two_dispatchers):
    first, _ = two_dispatchers
    runs = []
    for _ in range(10):
        runs.append(NoOp3.start())
        time.sleep(0.1)
    eventually(lambda: all(wf.reload().status == "finished" for wf in runs), what="the runs")

    claimers = [WorkflowStep.objects.get(run_id=wf.record.pk, step_name="a").claimed_by for wf in runs]
    # The other claims a step only once it has been due for its delay: on a loaded machine the
    # first may be that slow now and then, never for most of them.
    assert claimers.count(first) >= 8, claimers


@pytest.mark.processes
def test_what_the_first_cannot_take_a_follower_takes(two_dispatchers):
    slow = Slow.start(seconds=120)  # busy for longer than the test waits: the dispatchers are killed after it
    eventually(lambda: SideEffect.objects.filter(label="slow-start").exists(), what="the slow body")
    busy = WorkflowStep.objects.get(run_id=slow.record.pk, step_name="work").claimed_by

    quick = NoOp3.start()  # the busy one's only slot is taken: the other must run it
    eventually(lambda: quick.reload().status == "finished", what="the quick run")

    assert not SideEffect.objects.filter(label="slow-end").exists()
    assert WorkflowStep.objects.get(run_id=quick.record.pk, step_name="a").claimed_by != busy
    assert busy in two_dispatchers


@pytest.mark.processes
def test_when_the_first_dies_a_follower_takes_the_work_and_when_it_stops_another_is_first():
    processes = {}
    try:
        for _ in range(3):
            process = DispatcherProcess("--no-sweep", "--concurrency", "1")
            eventually(lambda p=process: "started" in p.output(), what="a dispatcher started")
            processes[Dispatcher.objects.order_by("-started_at").values_list("name", flat=True).first()] = process
        eventually(lambda: Dispatcher.objects.filter(workers_alive__gt=0).count() == 3, what="all registered")
        first, second, third = sorted(processes)
        for name in (second, third):
            eventually(lambda n=name: f"now follows {first}" in processes[n].output(), what=f"{name} follows")

        processes[first].kill()  # its row lives on until DISPATCHER_DEAD_AFTER: the others stay followers
        wf = NoOp3.start()
        eventually(lambda: wf.reload().status == "finished", timeout=10, what="the run, taken by a follower")
        claimers = set(WorkflowStep.objects.filter(run_id=wf.record.pk).values_list("claimed_by", flat=True))
        assert claimers in ({second}, {third})

        Dispatcher.objects.filter(name=first).delete()  # the sweep's verdict on the dead one
        processes[second].send(15)  # it stops: its leaving makes the third elect again at once
        assert processes[second].wait() == 0
        eventually(lambda: "now claims at once" in processes[third].output(), timeout=5, what="the third is first")
    finally:
        for process in processes.values():
            process.stop()


class _CountedListener:
    """A LISTENing connection that counts how often the listener thread asks it for notifications."""

    def __init__(self, conn):
        self.conn = conn
        self.reads = 0

    def notifies(self, **kwargs):
        self.reads += 1
        return self.conn.notifies(**kwargs)


class _CountedWake:
    """Stands in for the dispatcher's waker: at each wake-up, how often the listener had read so far."""

    def __init__(self):
        self.listener = None
        self.reads_at = []

    def set(self):
        self.reads_at.append(self.listener.reads)


def test_a_follower_reads_what_comes_during_its_delay_in_one_go_and_wakes_its_loop_once():
    """A trickle sends a NOTIFY a start to every dispatcher: a follower does not wake for each."""
    dispatcher = WorkflowDispatcher(concurrency=1, schedules=False)
    dispatcher.wakeups.first, dispatcher.wakeups.delay = False, FOLLOW_MAX  # the 40 below take far less
    dispatcher._wake.close()
    wake = dispatcher._wake = dispatcher.listener.wake = _CountedWake()
    channel, group = settings.NOTIFY_CHANNEL, dispatchers_channel()
    with (
        psycopg.connect(**connection_params(), autocommit=True) as conn,
        psycopg.connect(**connection_params(), autocommit=True) as sender,
    ):
        for name in (channel, group):
            conn.execute(psql.SQL("LISTEN {}").format(psql.Identifier(name)))
        listener = wake.listener = _CountedListener(conn)
        thread = threading.Thread(target=dispatcher.listener.hear, args=(listener, group))
        thread.start()
        try:
            for _ in range(40):  # 40 starts, one every 5 ms: all within the follower's delay
                sender.execute("SELECT pg_notify(%s, 'default')", [channel])
                time.sleep(0.005)
            eventually(lambda: wake.reads_at, what="the follower's deferred wake-up")
            # Three reads later: a NOTIFY left unread would have been read, and its deferred
            # wake-up set, before the third.
            eventually(lambda: listener.reads >= wake.reads_at[0] + 3, what="the listener to read on")
        finally:
            dispatcher._stopping.set()
            thread.join(5)

    assert len(wake.reads_at) == 1, wake.reads_at
    # The first NOTIFY sets the wake-up; the rest are read together when it is due: about 40
    # reads, one a NOTIFY, before.
    assert wake.reads_at[0] <= 4, wake.reads_at
