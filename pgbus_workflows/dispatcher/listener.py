"""The dispatcher's LISTEN thread: wakes the main loop when work arrives for a served queue.

It holds a connection of its own (LISTEN needs a session: behind a pool in transaction mode
no notification arrives, which the first connection's probe detects and logs), reconnects
with backoff, and on each NOTIFY wakes the loop at once (the first dispatcher of its group)
or a follower's moment later (``wakeups``). A NOTIFY on the group's channel (a dispatcher
joined or left) sets ``regroup``, so the heartbeat thread elects again at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
from psycopg import sql as psql

from .. import sql
from ..conf import settings
from ..sql.session import connection_params, hold_liveness_lock, probe_listen
from .waker import Waker
from .wakeups import Wakeups, dispatchers_channel

logger = logging.getLogger("pgbus_workflows")


class Listener:
    """LISTENs on ``NOTIFY_CHANNEL`` and the group's channel until ``stopping`` is set (``run()``)."""

    def __init__(
        self,
        name: str,
        queues: frozenset[str] | None,
        wakeups: Wakeups,
        stopping: threading.Event,
        wake: Waker,
        regroup: threading.Event,
    ) -> None:
        #: The dispatcher's name: its session holds the liveness lock of that name.
        self.name = name
        #: Whether the LISTEN connection is a session of its own (its probe came back).
        self.session = False
        #: Whether the current connection holds the liveness lock (the heartbeat writes it on the row).
        self.holds_lock = False
        self.queues = queues
        self.wakeups = wakeups
        self.stopping = stopping
        #: The main loop's waker; set for each NOTIFY of a served queue.
        self.wake = wake
        #: Set when a dispatcher joined or left: the heartbeat thread elects again at once.
        self.regroup = regroup

    def run(self) -> None:
        """Wake the main thread on every NOTIFY for a served queue; reconnect with backoff."""
        backoff = 0.5
        channel, group = settings.NOTIFY_CHANNEL, dispatchers_channel()
        probed = False
        while not self.stopping.is_set():
            try:
                with psycopg.connect(**connection_params(), autocommit=True) as conn:
                    for name in (channel, group):
                        conn.execute(psql.SQL("LISTEN {}").format(psql.Identifier(name)))
                    if not probed:
                        probed = True
                        self.session = probe_listen(conn, channel)
                        if self.session:
                            if settings.PREPARED_STATEMENTS:  # a session of our own: they are safe
                                sql.prepare_statements(conn)
                        else:
                            logger.warning(
                                "LISTEN on %s does not receive notifications (a connection pool in "
                                "transaction mode?): wake-ups fall back to the poll every POLL_INTERVAL. "
                                "Point dispatchers at PostgreSQL directly or at a session-mode pool.",
                                channel,
                            )
                    if self.session:
                        self.holds_lock = hold_liveness_lock(conn, self.name)
                    self.wake.set()  # anything sent while we were away
                    self.regroup.set()  # and the heartbeat, run now, writes whether the lock is held
                    backoff = 0.5
                    self.hear(conn, group)
            except psycopg.Error as error:
                self.holds_lock = False  # the session, and its lock, are gone
                self.regroup.set()  # the heartbeat says so on the row now
                logger.warning("LISTEN connection lost (%s); reconnecting in %.1fs", str(error).strip(), backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def hear(self, conn: psycopg.Connection[Any], group: str) -> None:
        """Wake the main thread for each NOTIFY of a served queue: at once, or a follower's moment later.

        Once a follower's wake-up is set, what arrives before it is due would not move it: the
        thread sleeps until then and reads all that came in one go rather than waking for each
        (a trickle of runs sends one a start, to every dispatcher).
        """
        deferred: float | None = None  # when a follower's deferred wake-up is due (time.monotonic())
        while not self.stopping.is_set():
            if self.session and not self.holds_lock:  # again each round: a sweep may have been testing it
                self.holds_lock = hold_liveness_lock(conn, self.name)
                if self.holds_lock:
                    self.regroup.set()
            if deferred is None:
                notes = conn.notifies(timeout=1.0, stop_after=1)
            else:
                self.stopping.wait(max(deferred - time.monotonic(), 0.0))
                notes = conn.notifies(timeout=0.0)  # what came meanwhile, without waiting
            for note in notes:
                if note.channel == group:
                    self.regroup.set()
                elif self.queues is None or note.payload in self.queues:
                    delay = self.wakeups.deferral()
                    if not delay:
                        self.wake.set()
                    elif deferred is None:
                        deferred = time.monotonic() + delay
            if deferred is not None and time.monotonic() >= deferred:
                deferred = None
                self.wake.set()
