"""The dispatcher's schedule leader: one dispatcher at a time fires the schedules' ticks, on time.

Each dispatcher runs a :class:`ScheduleLeader` on a thread of its own. The one that holds the
advisory lock :data:`SCHEDULE_LOCK_KEY` is the leader: a transaction-level lock on a
connection of its own (``session.TransactionLock``, right behind PgBouncer too), which
PostgreSQL releases when the process dies, SIGKILL included. The others try again every
:data:`STANDBY_INTERVAL`, so a new leader takes over within about a second of the old one's
death.

The leader syncs the classes' declared schedules when it takes the lead, then sleeps until
the earliest ``due_at`` (at most :data:`LEADER_INTERVAL`, so a schedule added meanwhile is
seen) and fires what is due (``services.firing``). That timer is its own: ticks fire within
about a second of their time whatever ``SWEEP_INTERVAL`` is. Leadership only saves work:
exactly one run per tick is the schedule row's lock and the database's unique index, so two
leaders (a lock lost during a network partition) still never fire a tick twice.

On SQLite (one dispatcher) there is no advisory lock: the dispatcher is the leader.
"""

from __future__ import annotations

import logging
import threading

from django.db import InterfaceError, OperationalError, connection

from .. import sql
from ..services.firing import fire_due, next_due_at
from ..services.schedules import sync_declared
from ..sql import clock
from ..sql.session import TransactionLock

logger = logging.getLogger("pgbus_workflows")

#: Advisory lock key held by the schedule leader ("pgbsch" in ASCII; the sweep's is "pgbus").
SCHEDULE_LOCK_KEY = 0x706762736368
#: Seconds between a standby's attempts to take the lead.
STANDBY_INTERVAL = 1.0
#: The longest the leader sleeps between two looks at what is due.
LEADER_INTERVAL = 1.0
#: How soon the leader looks again at a due schedule it had to pass over.
HELD_RETRY = 0.2

DB_ERRORS = (OperationalError, InterfaceError)


class ScheduleLeader:
    """Fires due schedule ticks while this process holds the schedule lock."""

    def __init__(self, name: str, stopping: threading.Event) -> None:
        self.name = name
        self.stopping = stopping
        self._lock: TransactionLock | None = None
        self._leading = False
        self._synced = False

    @property
    def leading(self) -> bool:
        """Whether this process is the leader now."""
        return self._leading

    def run(self) -> None:
        """The thread's loop: lead (or stand by) until the dispatcher stops; errors are logged."""
        backoff = STANDBY_INTERVAL
        try:
            while not self.stopping.is_set():
                try:
                    wait = self.round()
                    backoff = STANDBY_INTERVAL
                except DB_ERRORS as error:
                    logger.warning(
                        "Schedules: database unavailable (%s); retrying in %.1fs", str(error).strip(), backoff
                    )
                    self._resign()
                    connection.close()
                    wait, backoff = backoff, min(backoff * 2, 10.0)
                except Exception:
                    logger.exception("Schedules: firing failed; trying again in %.1fs", STANDBY_INTERVAL)
                    wait = STANDBY_INTERVAL
                self.stopping.wait(wait)
        finally:
            self._resign()
            connection.close()

    def round(self) -> float:
        """Fire what is due if this process leads; returns how long to sleep before the next round."""
        if not self._lead():
            return STANDBY_INTERVAL
        self._sync_if_new()
        fired = fire_due()
        due = next_due_at()
        if due is None:
            return LEADER_INTERVAL
        wait = (due - clock.now()).total_seconds()
        if wait <= 0 and not fired:
            return HELD_RETRY  # due, yet passed over: an operator holds it; look again soon, not at once
        return max(0.0, min(LEADER_INTERVAL, wait))

    def once(self) -> None:
        """Fire what is due now if no other dispatcher leads (``--once``), then let go of the lead."""
        try:
            if self._lead():
                self._sync_if_new()
                fire_due()
        finally:
            self._resign()

    def _lead(self) -> bool:
        """Take (or keep) the lead; on taking it, sync the declared schedules."""
        if not sql.postgresql():
            if not self._leading:
                self._took_lead()
            return True
        if self._lock is not None:
            if self._lock.held():
                return True
            logger.warning("Schedules: %s lost the lead (its lock connection dropped)", self.name)
            self._lock = None
            self._leading = False
        lock = TransactionLock(SCHEDULE_LOCK_KEY)
        if not lock.acquire():
            return False
        self._lock = lock
        self._took_lead()
        return True

    def _took_lead(self) -> None:
        self._leading = True
        self._synced = False
        logger.info("Schedules: %s leads", self.name)

    def _sync_if_new(self) -> None:
        """A new leader first makes the rows match its code's declared schedules (again, after a failure).

        A sync that fails (but for the database being away) is logged and tried again next
        round, and the schedules already stored fire meanwhile: a bad declaration never stops them.
        """
        if self._synced:
            return
        try:
            counts = sync_declared()
        except DB_ERRORS:
            raise
        except Exception:
            logger.exception("Schedules: syncing the declared schedules failed; firing the stored ones")
            return
        self._synced = True
        logger.info("Schedules: declared schedules synced (%s)", ", ".join(f"{k} {v}" for k, v in counts.items()))

    def _resign(self) -> None:
        lock, self._lock = self._lock, None
        self._leading = False
        if lock is not None:
            try:
                lock.release()
            except Exception:  # the connection is gone: so is the lock
                logger.debug("Schedules: releasing the lock failed", exc_info=True)
