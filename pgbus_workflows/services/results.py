"""Waiting for a run's end from any process: ``wf.result(timeout=)``.

On PostgreSQL the waiter LISTENs on a connection of its own, then marks the run ``awaited``
(an ``UPDATE``, so it waits for a transaction that holds the run and then sees what it
wrote): the transaction that ends an awaited run NOTIFYs its workflow id, and no other run's
end costs a NOTIFY. The status is read again every few seconds all the same, so a
notification lost (a pool in transaction mode does not carry LISTEN) only delays the answer.
SQLite has no LISTEN: the waiter reads the status with a growing pause.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql as pgsql

from .. import session, sql
from ..models import WorkflowRun
from ..states import TERMINAL_RUN
from .ledger import ended_channel

#: How often a waiter reads the status again though no notification came (seconds).
RECHECK_SECONDS = 5.0
#: SQLite: the pauses between reads of the status grow from the first to the last (seconds).
POLL_SECONDS = (0.02, 0.5)


def wait_for_end(run: WorkflowRun, timeout: float | timedelta | None = None) -> WorkflowRun:
    """Block until ``run`` is finished or cancelled; returns its row. Raises ``TimeoutError``."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if seconds is not None and seconds < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    deadline = None if seconds is None else time.monotonic() + seconds
    current = WorkflowRun.objects.get(pk=run.pk)  # on the caller's connection: it sees its own transaction
    if current.status in TERMINAL_RUN:
        return current
    if sql.postgresql():
        _listen_until_ended(run, deadline)
    else:
        _poll_until_ended(run, deadline)
    return WorkflowRun.objects.get(pk=run.pk)


def _remaining(deadline: float | None, run: WorkflowRun) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"Run {run.workflow_id} ({run.workflow_class}) did not end in time")
    return left


def _listen_until_ended(run: WorkflowRun, deadline: float | None) -> None:
    table = pgsql.Identifier(WorkflowRun._meta.db_table)
    mark = pgsql.SQL("UPDATE {} SET awaited = true WHERE id = %s RETURNING status").format(table)
    read = pgsql.SQL("SELECT status FROM {} WHERE id = %s").format(table)
    with psycopg.connect(**session.connection_params(), autocommit=True) as conn:
        conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(ended_channel())))
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
