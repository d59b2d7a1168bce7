"""Transactions that survive a dropped connection without being applied twice.

A COMMIT whose answer is lost (the connection drops after the server committed, before the
client heard) is the one failure a retry cannot tell from a transaction that never ran.
:func:`commit_once` notes the transaction's id before it commits; after a dropped connection
it asks the server (``pg_xact_status``) whether that transaction committed, and runs the work
again only when it did not. What the work returned is kept for the caller only once it is known
to have committed (the steps a committed batch claimed for this worker are then run, not lost).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import InterfaceError, OperationalError, connection, transaction

from .. import sql
from ..sql.holding import active_holds, holds_from

logger = logging.getLogger("pgbus_workflows")
T = TypeVar("T")

#: Errors that mean the connection is gone (reconnect), not that the statement was wrong.
CONNECTION_ERRORS = (OperationalError, InterfaceError)
#: How long to wait for the server to finish (or abort) a transaction whose client vanished.
SETTLE_SECONDS = 10.0
#: The question of the id of this thread's :func:`commit_once` transaction, while its work runs.
_asked = threading.local()


def _pause(seconds: float) -> None:
    """Wait ``seconds`` on the monotonic clock (a timed wait, like the dispatcher's other waits).

    Not ``time.sleep``: under libfaketime with a true monotonic clock (the skewed-clock tests
    and the chaos harness) ``clock_nanosleep`` fails with EINVAL.
    """
    threading.Event().wait(seconds)


class CommitUnknown(OperationalError):
    """The connection dropped during a transaction and whether it committed cannot be told."""


def with_reconnect(work: Callable[[], T], attempts: int = 6) -> T:
    """Run ``work``; when the connection drops, reconnect with backoff and run it again.

    Only for work that is safe to repeat (reads, re-checked moves). Inside a caller's
    transaction nothing can be retried, so the error is raised at once.
    """
    delay = 0.2
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except CONNECTION_ERRORS:
            if connection.in_atomic_block or attempt == attempts:
                raise
            logger.warning("Database connection lost; reconnecting in %.1fs (attempt %d)", delay, attempt)
            connection.close()
            _pause(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


@dataclass
class _Transaction(Generic[T]):
    """What is known of one try: the server's id for it, and what the work returned."""

    xid: str | None = None
    backend: int | None = None
    result: T | None = None
    finished: bool = False


def commit_once(work: Callable[[], T], *, retry: bool = True, attempts: int = 6, on_indexes: bool = False) -> T:
    """Run ``work`` in a transaction and commit it exactly once, whatever the connection does.

    When the connection drops: reconnect; if the transaction committed, return what ``work``
    returned; if it did not, run it again (``retry=True``) or raise the connection error
    (``retry=False``: the caller recovers another way). :class:`CommitUnknown` when the server
    cannot be asked. Inside a caller's transaction it is a savepoint of it, and errors go up.

    ``on_indexes`` (the engine's own statements only, never a step's body): the transaction
    plans without sequential or bitmap scans, set with the question of its id, so from
    the work's first pipeline on. A dispatcher's connection keeps each prepared statement's
    plan for its life; one made while the tables were small (a new install, or autovacuum
    off or behind, so no ANALYZE since) would read a whole table for the few rows a key finds,
    on every call, as the table grows. Not inside a caller's transaction, which it would outlast.
    """
    if connection.in_atomic_block:
        with transaction.atomic():  # a savepoint: a failure leaves the caller's transaction usable
            return work()
    delay = 0.2
    for attempt in range(1, attempts + 1):
        state: _Transaction[T] = _Transaction()
        try:
            with transaction.atomic():
                identity = _asked.lead = _identify(on_indexes)
                try:
                    state.result = work()
                    state.xid, state.backend = _identity(identity)
                finally:
                    _asked.lead = None
                    if identity is not None:
                        identity.drop()
                state.finished = True
            return state.result
        except CONNECTION_ERRORS as error:
            connection.close()
            if state.finished and state.xid is not None and _committed(state):
                logger.warning("The answer to a COMMIT was lost; the transaction had committed")
                return state.result  # type: ignore[return-value]
            if not retry or attempt == attempts:
                raise error
            logger.warning("Database connection lost; retrying in %.1fs (attempt %d)", delay, attempt)
            _pause(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


def _identify(on_indexes: bool) -> sql.Lead | None:
    """Ask for this transaction's id (assigned then) and this connection's server process, on PostgreSQL.

    The question goes with the work's first pipeline (the locks of a batch, say), in its
    round trip; :func:`_identity` reads the answer before the COMMIT. ``on_indexes``: see
    :func:`commit_once`.
    """
    return sql.lead_with(sql.statement("transaction_id", on_indexes)) if sql.postgresql() else None


def holds_in_force() -> frozenset[tuple[str, str]]:
    """``(kind, name)`` of the holds in force, as this transaction began.

    In :func:`commit_once`'s work on PostgreSQL they came with the question of its id, in the
    first pipeline's round trip; elsewhere one read.
    """
    lead: sql.Lead | None = getattr(_asked, "lead", None)
    return active_holds() if lead is None else holds_from(lead.row()[2])


def _identity(lead: sql.Lead | None) -> tuple[str | None, int | None]:
    """The answer to :func:`_identify`: the transaction's id and the server process (None, None off PostgreSQL)."""
    if lead is None:
        return None, None
    xid, backend = lead.row()[:2]
    return xid, backend


def _committed(state: _Transaction[Any]) -> bool:
    """Ask the server, on a new connection, whether the transaction committed.

    A transaction still in progress belongs to a server process that has not yet seen its
    client vanish: it is ended (``pg_terminate_backend``) so that the answer is final.
    """
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        try:
            with sql.cursor() as cursor:
                cursor.execute(sql.statement("transaction_status"), [state.xid])
                row: Any = cursor.fetchone()
                status = row[0] if row else None
                if status == "in progress":
                    cursor.execute(sql.statement("terminate_backend"), [state.backend])
        except CONNECTION_ERRORS as error:
            connection.close()
            if time.monotonic() > deadline:
                raise CommitUnknown(f"Could not ask whether transaction {state.xid} committed: {error}") from error
            _pause(0.5)
            continue
        if status == "committed":
            return True
        if status == "aborted":
            return False
        if status is None or time.monotonic() > deadline:
            raise CommitUnknown(f"Transaction {state.xid} is {status or 'unknown to the server'}")
        _pause(0.05)
