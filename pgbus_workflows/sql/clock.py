"""The database's clock: every time the engine writes or compares is the database server's.

Deadlines (``scheduled_at``, ``stall_at``, ``timeout_at``, heartbeats) are written by one host
and compared by another. Were each host to use its own clock, a sweeper whose clock runs 60 s
ahead would stall healthy steps of every other dispatcher, and a web server whose clock is
behind would schedule waits that end early. So :func:`now` returns the database server's time:
read once (``clock_timestamp()``, half the round trip subtracted), then carried forward with
this process's monotonic clock, which no clock step or skew of the host's wall clock moves.
It is read again every :data:`REANCHOR_EVERY` seconds to follow the server's own adjustments.

On SQLite the database runs in this process: its clock is this host's.

The test helpers' virtual clock (``WorkflowTestMixin.advance``) moves every later reading of
this process ahead by what :func:`skip_ahead` added, until :func:`stop_skipping`.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.utils import timezone

from .. import sql

logger = logging.getLogger("pgbus_workflows")

#: Seconds between two readings of the server's clock.
REANCHOR_EVERY = 30.0

_lock = threading.Lock()
#: ``(server time, time.monotonic() at that server time)``, or None before the first reading.
_anchor: tuple[datetime, float] | None = None
#: Virtual time the test helpers let pass, added to every reading (:func:`skip_ahead`).
_skipped = timedelta(0)


def now() -> datetime:
    """The database server's current time (an aware datetime), as read through this process."""
    anchor = _anchor
    mono = time.monotonic()
    if anchor is None or mono - anchor[1] > REANCHOR_EVERY:
        anchor = _read()
        mono = time.monotonic()
    if anchor is None:
        return timezone.now() + _skipped
    return anchor[0] + timedelta(seconds=mono - anchor[1]) + _skipped


def skip_ahead(by: timedelta) -> None:
    """Move every later :func:`now` of this process ``by`` ahead: time passes with no sleeping (tests only).

    The engine compares every deadline with :func:`now`, so waits, backoffs, signal timeouts
    and schedule ticks that end within ``by`` are due at once. Other processes (a dispatcher
    started apart) keep the server's time.
    """
    global _skipped
    with _lock:
        _skipped += by


def skipped() -> timedelta:
    """How far :func:`skip_ahead` has moved this process's clock (zero: the server's time)."""
    return _skipped


def stop_skipping() -> None:
    """Go back to the server's time: undo every :func:`skip_ahead` (the test helpers call it as a test ends)."""
    global _skipped
    with _lock:
        _skipped = timedelta(0)


def forget() -> None:
    """Drop the reading, so the next :func:`now` reads the server's clock again (tests, forks)."""
    global _anchor
    with _lock:
        _anchor = None


def _read() -> tuple[datetime, float] | None:
    """Read the server's clock on this thread's connection; keep the previous reading on failure."""
    global _anchor
    if not sql.postgresql():
        return None
    try:
        with sql.cursor() as cursor:
            before = time.monotonic()
            cursor.execute(sql.statement("database_clock"))
            after = time.monotonic()
            row = cursor.fetchone()
    except DatabaseError:
        # No connection (or an aborted transaction) right now: the last reading, carried
        # forward, is still the best estimate; without one, this host's clock.
        logger.debug("Could not read the database clock", exc_info=True)
        return _anchor
    if row is None:
        return _anchor
    reading = (row[0], (before + after) / 2)
    with _lock:
        _anchor = reading
    return reading
