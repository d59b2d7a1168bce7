"""``wf.result(timeout=)``: the timeout bounds every wait, and only a finite duration >= 0 (or None) is one.

A real second connection holds the run's row lock (as an ``atomic=True`` body or an operator's
open transaction does): ``result(timeout=1)`` must still give up within about a second.
"""

import math
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.services import results
from pgbus_workflows.sql import session
from tests.procs import eventually
from tests.support import run_next, sessions_waiting_for_a_lock
from tests.testapp.child_workflows import Waiter
from tests.threads import Worker

#: The holder lets go after this long whatever happens, so a waiter that ignores its timeout
#: makes the test fail (too slow) instead of hanging.
HOLD_AT_MOST = 8.0


def hold_run_lock(run: WorkflowRun) -> psycopg.Connection:
    """A connection of its own, in a transaction that holds ``run``'s row lock until it ends."""
    holder = psycopg.connect(**session.connection_params())
    holder.execute(f"SELECT 1 FROM {WorkflowRun._meta.db_table} WHERE id = %s FOR UPDATE", [run.pk])
    return holder


@pytest.mark.django_db(transaction=True)
def test_result_times_out_while_another_transaction_holds_the_run():
    wf = Waiter.start(n=1)
    holder = hold_run_lock(wf.record)
    release = threading.Timer(HOLD_AT_MOST, holder.rollback)
    release.start()
    try:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="did not end in time"):
            wf.result(timeout=1)
        elapsed = time.monotonic() - began
        # It gave up while the holder still held the run: the timeout bounds a wait for the lock too.
        held_throughout = not release.finished.is_set()
    finally:
        release.cancel()
        holder.rollback()
        holder.close()
    assert held_throughout
    assert elapsed >= 0.9, elapsed  # not before its timeout


@pytest.mark.django_db(transaction=True)
def test_a_lock_released_within_the_timeout_lets_the_waiter_see_the_end():
    wf = Waiter.start(n=1)
    run_next(wf)  # parks, waiting for "go"
    holder = hold_run_lock(wf.record)
    waiter = Worker(lambda: Waiter.find(wf.workflow_id).result(timeout=30))
    waiter.start()
    eventually(sessions_waiting_for_a_lock, what="the waiter to queue behind the holder")
    holder.rollback()
    holder.close()
    wf.signal("go", "through")
    run_next(wf)
    assert waiter.finish() == "through"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "timeout",
    [math.nan, math.inf, -math.inf, -1, -0.5, timedelta(seconds=-1), True, False, "5", [1]],
    ids=repr,
)
def test_a_timeout_that_is_no_finite_duration_of_zero_or_more_is_refused(timeout):
    wf = Waiter.start(n=1)
    with pytest.raises(ValueError, match="timeout must be"):
        wf.result(timeout=timeout)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("timeout", [0, 0.0, timedelta(0), timedelta(milliseconds=100)], ids=repr)
def test_a_zero_or_small_timeout_raises_timeout_error_at_once(timeout, monkeypatch):
    # Rechecks an hour apart: a waiter that took zero for no limit, or waited past a small
    # timeout for the next recheck, would still wait when the thread's join gives up.
    monkeypatch.setattr(results, "RECHECK_SECONDS", 3600.0)
    wf = Waiter.start(n=1)
    waiter = Worker(lambda: Waiter.find(wf.workflow_id).result(timeout=timeout))
    waiter.start()
    with pytest.raises(TimeoutError):
        waiter.finish()
