"""Waiting for a run's end from any process: ``wf.result(timeout=)``.

On PostgreSQL the waiter LISTENs on a connection of its own, then marks the run ``awaited``
(an ``UPDATE``, so it waits for a transaction that holds the run and then sees what it
wrote): the transaction that ends an awaited run NOTIFYs its workflow id, and no other run's
end costs a NOTIFY. The status is read again every few seconds all the same, so a
notification lost (a pool in transaction mode does not carry LISTEN) only delays the answer.
SQLite has no LISTEN: the waiter reads the status with a growing pause.

The timeout bounds every wait, the wait for a transaction that holds the run's row included:
the marking ``UPDATE`` runs under a ``lock_timeout`` of the time left, so a step body that
holds the run (``atomic=True``) or an operator's open transaction cannot keep the caller past it.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql as pgsql

from .. import sql
from ..models import WorkflowRun
from ..sql import session
from ..states import TERMINAL_RUN
from .ledger import ended_channel

#: How often a waiter reads the status again though no notification came (seconds).
RECHECK_SECONDS = 5.0
#: SQLite: the pauses between reads of the status grow from the first to the last (seconds).
POLL_SECONDS = (0.02, 0.5)


def wait_for_end(run: WorkflowRun, timeout: float | timedelta | None = None) -> WorkflowRun:
    """Block until ``run`` is finished or cancelled; returns its row. Raises ``TimeoutError``."""
    seconds = timeout_seconds(timeout)
    deadline = None if seconds is None else time.monotonic() + seconds
    current = WorkflowRun.objects.get(pk=run.pk)  # on the caller's connection: it sees its own transaction
    if current.status in TERMINAL_RUN:
        return current
    if sql.postgresql():
        _listen_until_ended(run, deadline)
    else:
        _poll_until_ended(run, deadline)
    return WorkflowRun.objects.get(pk=run.pk)


def timeout_seconds(timeout: object) -> float | None:
    """``timeout`` in seconds (None: no limit); ``ValueError`` unless it is None or a finite duration >= 0.

    NaN would never compare as passed, and infinity is spelled None; a bool is no duration.
    """
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise ValueError(f"timeout must be a number of seconds, a timedelta or None, got {timeout!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"timeout must be >= 0 seconds (a finite number) or None, got {timeout!r}")
    return seconds


def _remaining(deadline: float | None, run: WorkflowRun) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"Run {run.workflow_id} ({run.workflow_class}) did not end in time")
    return left


def _listen_until_ended(run: WorkflowRun, deadline: float | None) -> None:
    params = session.connection_params()
    left = _remaining(deadline, run)
    if left is not None:  # connecting counts against the timeout too (libpq takes whole seconds, at least 2)
        params["connect_timeout"] = max(2, math.ceil(left))
    with psycopg.connect(**params, autocommit=True) as conn:
        try:
            _listen(conn, run, deadline)
        except pgerrors.LockNotAvailable:  # lock_timeout: the deadline passed while a lock was held
            raise TimeoutError(
                f"Run {run.workflow_id} ({run.workflow_class}) did not end in time (another transaction held it)"
            ) from None


def _listen(conn: psycopg.Connection[Any], run: WorkflowRun, deadline: float | None) -> None:
    """On ``conn``: LISTEN, mark the run awaited, then wait for its end (a NOTIFY, or a read every few seconds).

    The marking ``UPDATE`` waits for a transaction that holds the run, then sees what it wrote.
    With a deadline, ``lock_timeout`` is the time left (in whole milliseconds, at least one:
    zero would mean no limit), so that wait ends with it; it stays set for the session, so a
    later read waits no longer than that for a table lock either (a migration's).
    """
    table = pgsql.Identifier(WorkflowRun._meta.db_table)
    mark = pgsql.SQL("UPDATE {} SET awaited = true WHERE id = %s RETURNING status").format(table)
    read = pgsql.SQL("SELECT status FROM {} WHERE id = %s").format(table)
    conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(ended_channel())))
    left = _remaining(deadline, run)
    if left is not None:
        conn.execute(sql.statement("lock_timeout"), [f"{max(1, math.ceil(left * 1000))}ms"])
    row = conn.execute(mark, [run.pk]).fetchone()
    if row is None:
        raise WorkflowRun.DoesNotExist(
            f"Run {run.workflow_id} is not visible to another connection: result() cannot wait inside "
            "the transaction that started the run (commit it first), nor for a deleted run"
        )
    status = row[0]
    wanted = str(run.workflow_id)
    while status not in TERMINAL_RUN:
        left = _remaining(deadline, run)
        wait = RECHECK_SECONDS if left is None else min(left, RECHECK_SECONDS)
        for notice in conn.notifies(timeout=wait):
            if notice.payload == wanted:
                break
        found = conn.execute(read, [run.pk]).fetchone()
        if found is None:
            raise WorkflowRun.DoesNotExist(f"Run {run.workflow_id} was deleted while awaited")
        status = found[0]


def _poll_until_ended(run: WorkflowRun, deadline: float | None) -> None:
    pause, longest = POLL_SECONDS
    while True:
        status: Any = WorkflowRun.objects.filter(pk=run.pk).values_list("status", flat=True).first()
        if status is None:
            raise WorkflowRun.DoesNotExist(f"Run {run.workflow_id} does not exist")
        if status in TERMINAL_RUN:
            return
        left = _remaining(deadline, run)
        time.sleep(pause if left is None else min(pause, left))
        pause = min(pause * 2, longest)
