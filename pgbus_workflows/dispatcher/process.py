"""The dispatcher process: claims due steps, runs them on worker threads, sweeps.

The main thread registers a ``Dispatcher`` row and heartbeats it, claims up to the free
worker slots in one query, hands the claimed work to the worker pool (``workers.py``: threads
with a database connection each), and runs the sweep when it is due. A listener thread (``listener.py``)
LISTENs on ``NOTIFY_CHANNEL`` and wakes the main thread; a timer set to the earliest future
``scheduled_at`` and a poll every ``POLL_INTERVAL`` are the fallbacks.

What a step does lives in ``services.executor``; this module is only the loop.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from types import FrameType
from typing import Any

from django.db import InterfaceError, OperationalError, connection

from .. import sql
from ..conf import settings
from ..dsl.deploy import catalog
from ..migrated import require_migrated
from ..models import Dispatcher, FanOutJob, WorkflowStep
from ..services import fanout, fanout_recovery
from ..services.claims import claim_and_look_ahead, stall
from ..sql import clock
from ..states import StepStatus
from .listener import Listener
from .scheduler import ScheduleLeader
from .sweep import Sweeper, lost_sessions
from .waker import Waker, join_until, stop_signals
from .wakeups import Wakeups, announce
from .workers import WorkerPool

logger = logging.getLogger("pgbus_workflows")

DB_ERRORS = (OperationalError, InterfaceError)
#: How long the shutdown waits for a heartbeat under way before it deletes the dispatcher's row.
HEARTBEAT_JOIN_TIMEOUT = 5.0


class WorkflowDispatcher:
    """One dispatcher process. ``run()`` returns the exit code."""

    def __init__(
        self,
        *,
        concurrency: int = 4,
        queues: list[str] | None = None,
        once: bool = False,
        sweep: bool = True,
        sweep_only: bool = False,
        shutdown_timeout: float = 30.0,
        schedules: bool = True,
        async_concurrency: int | None = None,
    ) -> None:
        self.concurrency = concurrency
        #: How many ``async def`` bodies await on the event loop at once holding no thread (past
        #: them, and with 0, each holds its worker while it awaits there). None: the setting
        #: ``ASYNC_CONCURRENCY``.
        self.async_concurrency = settings.ASYNC_CONCURRENCY if async_concurrency is None else async_concurrency
        self.queues = frozenset(queues) if queues else None
        self.once = once
        self.sweep = sweep or sweep_only
        self.sweep_only = sweep_only
        self.shutdown_timeout = shutdown_timeout
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.sweeper = Sweeper()
        #: Wakes the main loop; lock-free, so the signal handler may set it (``waker``).
        self._wake = Waker()
        self._stopping = threading.Event()
        #: Whether a NOTIFY is claimed at once (first of its group) or a moment later (``wakeups``).
        self.wakeups = Wakeups(self.name, self.queues)
        #: Set when a dispatcher joined or left: the heartbeat thread elects again at once.
        self._regroup = threading.Event()
        #: Set by the heartbeat when a dispatcher's session is gone: the sweep runs now, not at its interval.
        self._sweep_soon = threading.Event()
        self._announced = False
        #: None with ``--no-schedules``: this process never fires schedule ticks.
        self.schedule_leader = ScheduleLeader(self.name, self._stopping) if schedules else None
        self._signals = 0
        #: The signal that asked this process to stop, for the loop to act on (0: none yet).
        self._signalled = 0
        self._orphans_possible = threading.Event()
        #: Set when the last claim took as much as there was room for: more may be due, so a
        #: freed slot wakes the loop. Otherwise new work announces itself (NOTIFY, the timer).
        self._claim_on_free = True
        self.pool = WorkerPool(
            name=self.name,
            queues=self.queues,
            size=0 if sweep_only else concurrency,
            stopping=self._stopping,
            on_free=self._slot_freed,
            on_lost=self._orphans_possible.set,
            async_capacity=self.async_concurrency,
        )
        self._swept = False
        self._threads: dict[str, threading.Thread] = {}
        #: The LISTEN thread: wakes the loop on a NOTIFY for a served queue (``listener``).
        self.listener = Listener(self.name, self.queues, self.wakeups, self._stopping, self._wake, self._regroup)

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until stopped (or, with ``once``, until nothing is due); returns 0.

        Raises :class:`~pgbus_workflows.exceptions.NotMigrated` at once when the schema lacks
        this app's migrations (the command prints it as one line and exits 1).
        """
        require_migrated()
        self._register()
        queues = ", ".join(sorted(self.queues)) if self.queues else "all"
        logger.info(
            "Dispatcher %s started: queues %s, concurrency %d (and %d async bodies)%s",
            self.name,
            queues,
            self.concurrency,
            self.async_concurrency,
            " (sweep only)" if self.sweep_only else "" if self.sweep else " (no sweep)",
        )
        self.pool.start()
        # Heartbeat and sweep each on a thread (and connection) of their own: a long sweep
        # never delays claims, and a busy loop never lets the heartbeat go stale.
        beat = settings.HEARTBEAT_INTERVAL.total_seconds()
        self._start_thread("pgbus-heartbeat", partial(self._every, "Heartbeat", beat, self._heartbeat, self._regroup))
        if not self.once:
            if self.sweep:
                every = settings.SWEEP_INTERVAL.total_seconds()
                sweep = partial(self._every, "Sweep", every, self.sweeper.run, self._sweep_soon)
                self._start_thread("pgbus-sweep", sweep)
            if sql.postgresql() and not self.sweep_only:
                self._start_thread("pgbus-listener", self.listener.run)
            if self.schedule_leader is not None:
                self._start_thread("pgbus-schedules", self.schedule_leader.run)
        try:
            with stop_signals(self._on_signal, self._wake):
                try:
                    self._loop()
                finally:
                    abandoned = self._shut_down()
        finally:
            self._wake.close()  # once no signal can write to it (the handlers are restored)
        if abandoned and threading.current_thread() is threading.main_thread():
            # Worker threads still run bodies whose attempts were stalled: do not wait for them.
            logging.shutdown()
            os._exit(0)
        return 0

    def stop(self) -> None:
        """Stop claiming; running steps finish (up to the shutdown timeout)."""
        self._stopping.set()
        self._wake.set()
        self._regroup.set()
        self._sweep_soon.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: the loop stops (the first), or the process exits at once (the second).

        It runs on the main thread between two of its bytecodes, wherever the loop is: it takes
        no lock (the loop may hold it) and leaves the stopping and its log line to the loop.
        """
        self._signals += 1
        if self._signals > 1:
            try:
                logger.warning("Second signal: exiting at once; running steps are left to the sweep")
                _flush_logs()
            finally:
                os._exit(1)  # even when the log could not be written (a write it interrupted)
        self._signalled = signum
        self._wake.set()

    def _act_on_signal(self) -> None:
        """On the loop's thread: stop, as the first signal asked."""
        logger.info("Signal %s: finishing running steps, then exiting (signal again to exit at once)", self._signalled)
        self.stop()

    def _register(self) -> None:
        now = clock.now()
        Dispatcher.objects.update_or_create(
            name=self.name,
            defaults={
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "queues": sorted(self.queues) if self.queues else [],
                "concurrency": self.concurrency,
                "catalog": catalog(),
                "started_at": now,
                "heartbeat_at": now,
                "session_lock": self.listener.holds_lock,
            },
        )

    def _start_thread(self, name: str, target: Any) -> None:
        thread = self._threads[name] = threading.Thread(target=target, name=name, daemon=True)
        thread.start()

    def _heartbeat(self) -> None:
        now = clock.now()
        updated = Dispatcher.objects.filter(name=self.name).update(
            heartbeat_at=now, workers_alive=self.pool.alive(), session_lock=self.listener.holds_lock
        )
        if not updated and not self._stopping.is_set():
            logger.warning("Dispatcher %s was taken for dead (heartbeat too old): registering again", self.name)
            self._register()
        self.wakeups.elect()
        self.pool.cancel_stalled()  # a stalled attempt's async body leaves the loop, its place freed
        if self.sweep and not self.once and lost_sessions(now):
            self._sweep_soon.set()
        if not self._announced and self.pool.size:
            announce(self.name)  # the others elect again now, not at their next heartbeat
            self._announced = True

    def _every(
        self, what: str, interval: float, work: Callable[[], object], early: threading.Event | None = None
    ) -> None:
        """A thread's loop: ``work`` now and every ``interval`` seconds (sooner when ``early`` is set) until stopped.

        Errors are logged.
        """
        try:
            while not self._stopping.is_set():
                try:
                    work()
                except DB_ERRORS as error:
                    logger.warning("%s failed (%s); trying again in %.1fs", what, str(error).strip(), interval)
                    connection.close()
                except Exception:
                    logger.exception("%s failed; trying again in %.1fs", what, interval)
                if early is None:
                    self._stopping.wait(interval)
                else:
                    early.wait(interval)
                    early.clear()
        finally:
            connection.close()

    def _shut_down(self) -> bool:
        """Let the workers finish what this process claimed, up to the timeout; stall what is left.

        Returns True when some work was abandoned (its attempts stalled).
        """
        self.stop()
        held = len(self.pool.held())
        if held:
            logger.info("Waiting up to %ss for %d claimed step(s)", self.shutdown_timeout, held)
        abandoned = self.pool.join(time.monotonic() + self.shutdown_timeout)
        # A heartbeat under way when the stop came would otherwise register the row deleted below again.
        heartbeat = self._threads.get("pgbus-heartbeat")
        if heartbeat is not None:
            join_until(heartbeat, time.monotonic() + HEARTBEAT_JOIN_TIMEOUT)
        try:
            if abandoned:
                self._stall_own("shutdown_timeout")
                fanout_recovery.recover_jobs(clock.now(), dead=[self.name])
            Dispatcher.objects.filter(name=self.name).delete()
            if self._announced:
                announce(self.name)  # a follower may now be the first of the group
        except DB_ERRORS:
            logger.exception("Could not release dispatcher %s; the sweep will", self.name)
        logger.info("Dispatcher %s stopped", self.name)
        return abandoned

    def _stall_own(self, detection: str, keep: set[int] | None = None) -> int:
        """Stall this dispatcher's in-progress attempts that no worker thread runs."""
        now = clock.now()
        rows = WorkflowStep.objects.filter(status=StepStatus.IN_PROGRESS, claimed_by=self.name)
        stalled = 0
        for step_pk, run_pk in rows.values_list("pk", "run_id"):
            if keep is None or step_pk not in keep:
                stalled += stall(step_pk, run_pk, detection=detection, now=now)
        return stalled

    # -- the loop ------------------------------------------------------------------------------

    def _slot_freed(self) -> None:
        """A claim ended: claim again only if the last claim was cut short by the free slots."""
        if self._claim_on_free:
            self._wake.set()

    def _loop(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            if self._signalled:
                self._act_on_signal()
                return
            try:
                timeout = self._tick()
                backoff = 0.5
            except DB_ERRORS as error:
                logger.warning("Database unavailable (%s); retrying in %.1fs", str(error).strip(), backoff)
                connection.close()
                self._wake.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                self._recover_after_outage()
                continue
            if timeout is None:
                return
            self._wake.wait(timeout)

    def _tick(self) -> float | None:
        """One round: heartbeat, sweep, claim. Returns how long to sleep (None: ``once`` is done)."""
        if self._orphans_possible.is_set():
            self._orphans_possible.clear()
            self._recover_after_outage()
        if self.once and not self._swept:
            # --once sweeps on this thread, once, before it claims.
            if self.sweep:
                self.sweeper.run()
            if self.schedule_leader is not None:
                self.schedule_leader.once()
            self._swept = True
        if self.sweep_only:
            return None if self.once else settings.POLL_INTERVAL.total_seconds()
        free = self.pool.free_slots()
        self._claim_on_free = True
        if free < 1:
            # Every slot busy: a finishing worker wakes the loop, no need to look ahead.
            return 0.05 if self.once else settings.POLL_INTERVAL.total_seconds()
        lag = timedelta(seconds=self.wakeups.deferral())  # a follower leaves the first what it takes at once
        steps, ahead = claim_and_look_ahead(free, self.queues, self.name, due_for=lag)
        # Handed out before anything else: the claim's first body starts while the loop goes on.
        self.pool.hand_out(steps, verify=True)
        jobs: list[FanOutJob] = []
        if free > len(steps) and ahead.jobs_due:
            jobs = fanout.claim_due_jobs(free - len(steps), self.queues, self.name)
            self.pool.hand_out(jobs, verify=True)
        self.wakeups.claimed(len(steps) + len(jobs))
        if len(steps) + len(jobs) == free:
            return 0.0  # more may be due: claim again as soon as a slot is free
        self._claim_on_free = False  # all that was due was taken: what comes next sends a NOTIFY
        if self.once:
            return 0.05 if self.pool.held() or steps or jobs else None
        timeout = settings.POLL_INTERVAL.total_seconds()
        if ahead.next_due_at is not None:
            due_in = (ahead.next_due_at - clock.now()).total_seconds() + self.wakeups.deferral()
            timeout = min(timeout, due_in)
        return max(timeout, 0.0)

    def _recover_after_outage(self) -> None:
        """A claim whose commit we did not see may have committed: stall attempts no worker runs."""
        try:
            running = {pk for kind, pk in self.pool.held() if kind == "step"}
            recovered = self._stall_own("orphaned_claim", keep=running)
            if recovered:
                logger.warning("Recovered %d step(s) claimed before the connection dropped", recovered)
        except DB_ERRORS:
            connection.close()


def _flush_logs() -> None:
    """Flush every handler that would show a record of ours (``os._exit`` skips the flush at exit)."""
    node: logging.Logger | None = logger
    while node is not None:
        for handler in node.handlers:
            handler.flush()
        node = node.parent if node.propagate else None
    sys.stdout.flush()
    sys.stderr.flush()
