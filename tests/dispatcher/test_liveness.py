"""A dispatcher whose LISTEN session is gone is dead within seconds, not after ``DISPATCHER_DEAD_AFTER``.

Its session holds the liveness lock of its name; a connection of the test's plays that
session here, and closing it is the kernel closing a killed process's socket. The rule needs
both the lock free and the heartbeat two intervals old, and a row that never held the lock
(older code, a pool in transaction mode, SQLite) is judged by its heartbeat alone.
"""

import threading
from datetime import timedelta

import psycopg
import pytest
from django.test import override_settings
from django.utils import timezone

from pgbus_workflows.dispatcher.process import WorkflowDispatcher
from pgbus_workflows.dispatcher.sweep import Sweeper, lost_sessions, session_grace
from pgbus_workflows.models import Dispatcher, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.sql.session import (
    connection_params,
    hold_liveness_lock,
    liveness_key,
    liveness_lock_free,
)
from tests.procs import eventually
from tests.testapp.workflows import Counted

pytestmark = pytest.mark.django_db(transaction=True)

#: Heartbeats every 10 s (grace 20 s), dead after a minute of silence: 30 s is between the two.
SETTINGS = {"HEARTBEAT_INTERVAL": 10, "DISPATCHER_DEAD_AFTER": 60, "STALL_ACTION": "reattempt"}


def dispatcher(name: str, *, silent_for: float, session_lock: bool) -> Dispatcher:
    heartbeat = timezone.now() - timedelta(seconds=silent_for)
    return Dispatcher.objects.create(name=name, hostname="h", pid=1, heartbeat_at=heartbeat, session_lock=session_lock)


def session_of(name: str) -> psycopg.Connection:
    """A connection that holds ``name``'s liveness lock, as its LISTEN session does."""
    conn = psycopg.connect(**connection_params(), autocommit=True)
    assert hold_liveness_lock(conn, name)
    return conn


@override_settings(PGBUS_WORKFLOWS=SETTINGS)
def test_a_dispatcher_whose_session_closed_is_dead_and_its_step_reattempted_before_the_heartbeat_rule():
    wf = Counted.start()
    dispatcher("killed", silent_for=30, session_lock=True)
    claim_due_steps(1, claimed_by="killed")
    session = session_of("killed")

    assert lost_sessions(timezone.now()) == []  # its session still holds the lock: alive
    assert Sweeper().run()["dead_dispatchers"] == 0
    session.close()  # the kernel closes a killed process's socket; the server frees the lock

    # The server frees it when its backend has seen the connection go: a moment after the close.
    eventually(lambda: lost_sessions(timezone.now()) == ["killed"], timeout=30, what="the session's lock to go")
    assert Sweeper().run()["dead_dispatchers"] == 1
    steps = list(WorkflowStep.objects.filter(run=wf.record).order_by("pk").values_list("status", "outcome"))
    assert steps == [("failed", "stalled"), ("scheduled", "")]
    assert not Dispatcher.objects.filter(name="killed").exists()


@override_settings(PGBUS_WORKFLOWS=SETTINGS)
def test_a_free_lock_alone_kills_nothing_a_heartbeat_within_two_intervals_or_a_row_that_never_held_it():
    Counted.start()
    dispatcher("reconnecting", silent_for=5, session_lock=True)  # its LISTEN reconnects: lock free a moment
    dispatcher("old_code", silent_for=30, session_lock=False)  # never held it: the heartbeat rule only
    claim_due_steps(1, claimed_by="old_code")

    assert lost_sessions(timezone.now()) == []
    assert Sweeper().run()["dead_dispatchers"] == 0
    assert set(Dispatcher.objects.values_list("name", flat=True)) == {"reconnecting", "old_code"}
    assert WorkflowStep.objects.get().status == "in_progress"


@override_settings(PGBUS_WORKFLOWS={"HEARTBEAT_INTERVAL": 10, "DISPATCHER_DEAD_AFTER": 15})
def test_the_grace_is_two_heartbeats_but_never_more_than_the_dead_after_rule():
    assert session_grace() == timedelta(seconds=15)
    with override_settings(PGBUS_WORKFLOWS={"HEARTBEAT_INTERVAL": 3}):
        assert session_grace() == timedelta(seconds=6)


def test_one_session_holds_a_name_and_the_lock_is_free_again_when_it_ends():
    first = session_of("d-1")
    with psycopg.connect(**connection_params(), autocommit=True) as second:
        assert not hold_liveness_lock(second, "d-1")  # a second dispatcher of that name
        assert hold_liveness_lock(second, "d-2")
    assert not liveness_lock_free("d-1")
    first.close()
    eventually(lambda: liveness_lock_free("d-1"), timeout=30, what="the lock to go with its session")
    assert liveness_key("d-1") != liveness_key("d-2")
    assert -(2**31) <= liveness_key("d-1") < 2**31


class _RecordingRegroup(threading.Event):
    """The heartbeat's early wake-up, noting whether the listener held its lock each time it was set."""

    def __init__(self, listener_of):
        super().__init__()
        self.listener_of = listener_of
        self.held_when_set: list[bool] = []

    def set(self):
        self.held_when_set.append(self.listener_of().holds_lock)
        super().set()


def test_the_listener_holds_its_lock_before_it_wakes_the_heartbeat_that_writes_so():
    """Else a dispatcher killed before its next heartbeat would be told dead by that heartbeat's age alone."""
    dispatcher = WorkflowDispatcher(concurrency=1, schedules=False)
    listener = dispatcher.listener
    listener.regroup = regroup = _RecordingRegroup(lambda: listener)
    thread = threading.Thread(target=listener.run)
    thread.start()
    try:
        eventually(lambda: regroup.held_when_set, timeout=30, what="the listener to wake the heartbeat")
    finally:
        dispatcher._stopping.set()
        thread.join(10)
        dispatcher._wake.close()
    assert listener.session  # a direct connection: the probe came back
    assert regroup.held_when_set[0] is True
