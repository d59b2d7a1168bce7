"""The dispatcher process: claims due steps, runs them on worker threads, sweeps.

The main thread registers a ``Dispatcher`` row and heartbeats it, claims up to the free
worker slots in one query, hands each claimed attempt to a worker thread (each with its own
database connection), and runs the sweep when it is due. A listener thread LISTENs on
``NOTIFY_CHANNEL`` and wakes the main thread; a timer set to the earliest future
``scheduled_at`` and a poll every ``POLL_INTERVAL`` are the fallbacks.

What a step does lives in ``services.executor``; this module is only the loop.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from types import FrameType
from typing import Any

from django.db import InterfaceError, OperationalError, connection
from django.db.models import Min
from django.utils import timezone

from .conf import settings
from .models import Dispatcher, FanOutJob, JobStatus, WorkflowStep
from .services.executor import Chain, apply_outcomes, claim_due_steps, perform_step
from .services.fanout import claim_due_jobs, execute_job, recover_jobs
from .services.outcome import StepOutcome
from .states import RunStatus, StepStatus
from .sweep import Sweeper, stall

logger = logging.getLogger("pgbus_workflows")

DB_ERRORS = (OperationalError, InterfaceError)
#: The longest a worker keeps quick steps' outcomes before committing them together.
BATCH_WINDOW = 0.02


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
    ) -> None:
        self.concurrency = concurrency
        self.queues = frozenset(queues) if queues else None
        self.once = once
        self.sweep = sweep or sweep_only
        self.sweep_only = sweep_only
        self.shutdown_timeout = shutdown_timeout
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.sweeper = Sweeper()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._signals = 0
        self._lock = threading.Lock()
        # Claimed work no worker has started, with whether to re-check it before running it
        # (a claim by the loop may be cancelled before it starts; a chained step cannot).
        self._ready: deque[tuple[WorkflowStep | FanOutJob, bool]] = deque()
        self._has_work = threading.Condition()
        # ("step" | "job", pk) of every claim this process holds: queued, running or not yet applied.
        self._held: set[tuple[str, int]] = set()
        # How long bodies take (a moving average): sizes the claims so a batch stays short.
        self._body_seconds = 0.0
        self._next_sweep = 0.0
        self._next_heartbeat = 0.0
        self._orphans_possible = threading.Event()

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until stopped (or, with ``once``, until nothing is due); returns 0."""
        self._register()
        queues = ", ".join(sorted(self.queues)) if self.queues else "all"
        logger.info(
            "Dispatcher %s started: queues %s, concurrency %d%s",
            self.name,
            queues,
            self.concurrency,
            " (sweep only)" if self.sweep_only else "" if self.sweep else " (no sweep)",
        )
        workers = [
            threading.Thread(target=self._worker, name=f"pgbus-worker-{n}", daemon=True)
            for n in range(0 if self.sweep_only else self.concurrency)
        ]
        for worker in workers:
            worker.start()
        listener = None
        if connection.vendor == "postgresql" and not self.sweep_only and not self.once:
            listener = threading.Thread(target=self._listen, name="pgbus-listener", daemon=True)
            listener.start()
        with _stop_signals(self._on_signal):
            try:
                self._loop()
            finally:
                abandoned = self._shut_down(workers)
        if abandoned and threading.current_thread() is threading.main_thread():
            # Worker threads still run bodies whose attempts were stalled: do not wait for them.
            logging.shutdown()
            os._exit(0)
        return 0

    def stop(self) -> None:
        """Stop claiming; running steps finish (up to the shutdown timeout)."""
        self._stopping.set()
        self._wake.set()
        with self._has_work:
            self._has_work.notify_all()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            logger.warning("Second signal: exiting at once; running steps are left to the sweep")
            os._exit(1)
        logger.info("Signal %s: finishing running steps, then exiting (signal again to exit at once)", signum)
        self.stop()

    def _register(self) -> None:
        now = timezone.now()
        Dispatcher.objects.update_or_create(
            name=self.name,
            defaults={
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "queues": sorted(self.queues) if self.queues else [],
                "concurrency": self.concurrency,
                "started_at": now,
                "heartbeat_at": now,
            },
        )

    def _heartbeat(self) -> None:
        if not Dispatcher.objects.filter(name=self.name).update(heartbeat_at=timezone.now()):
            logger.warning("Dispatcher %s was taken for dead (heartbeat too old): registering again", self.name)
            self._register()

    def _shut_down(self, workers: list[threading.Thread]) -> bool:
        """Let the workers finish what this process claimed, up to the timeout; stall what is left.

        Returns True when some work was abandoned (its attempts stalled).
        """
        self.stop()
        with self._lock:
            held = len(self._held)
        if held:
            logger.info("Waiting up to %ss for %d claimed step(s)", self.shutdown_timeout, held)
        deadline = time.monotonic() + self.shutdown_timeout
        for worker in workers:
            worker.join(max(deadline - time.monotonic(), 0.0))
        abandoned = any(worker.is_alive() for worker in workers)
        try:
            if abandoned:
                self._stall_own("shutdown_timeout")
                recover_jobs(timezone.now(), dead=[self.name])
            Dispatcher.objects.filter(name=self.name).delete()
        except DB_ERRORS:
            logger.exception("Could not release dispatcher %s; the sweep will", self.name)
        logger.info("Dispatcher %s stopped", self.name)
        return abandoned

    def _stall_own(self, detection: str, keep: set[int] | None = None) -> int:
        """Stall this dispatcher's in-progress attempts that no worker thread runs."""
        now = timezone.now()
        rows = WorkflowStep.objects.filter(status=StepStatus.IN_PROGRESS, claimed_by=self.name)
        stalled = 0
        for step_pk, run_pk in rows.values_list("pk", "run_id"):
            if keep is None or step_pk not in keep:
                stalled += stall(step_pk, run_pk, detection=detection, now=now)
        return stalled

    # -- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                timeout = self._tick()
                backoff = 0.5
            except DB_ERRORS as error:
                logger.warning("Database unavailable (%s); retrying in %.1fs", str(error).strip(), backoff)
                connection.close()
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                self._recover_after_outage()
                continue
            if timeout is None:
                return
            self._wake.wait(timeout)
            self._wake.clear()

    def _tick(self) -> float | None:
        """One round: heartbeat, sweep, claim. Returns how long to sleep (None: ``once`` is done)."""
        clock = time.monotonic()
        if self._orphans_possible.is_set():
            self._orphans_possible.clear()
            self._recover_after_outage()
        if clock >= self._next_heartbeat:
            self._heartbeat()
            self._next_heartbeat = clock + settings.HEARTBEAT_INTERVAL.total_seconds()
        if self.sweep and clock >= self._next_sweep:
            self.sweeper.run()
            self._next_sweep = clock + settings.SWEEP_INTERVAL.total_seconds()
        if self.sweep_only:
            return None if self.once else self._sleep_until_due(clock)
        free = self._free_slots()
        claimed: list[WorkflowStep | FanOutJob] = []
        if free > 0:
            claimed.extend(claim_due_steps(free, self.queues, self.name))
        if free > len(claimed):
            claimed.extend(claim_due_jobs(free - len(claimed), self.queues, self.name))
        self._hand_out(claimed, verify=True)
        if len(claimed) == free and free > 0:
            return 0.0  # more may be due: claim again as soon as a slot is free
        if self.once:
            with self._lock:
                busy = bool(self._held)
            return 0.05 if busy or claimed else None
        # With every slot busy, a finishing worker wakes the loop: no need to look ahead.
        return self._sleep_until_due(clock, look_ahead=free > len(claimed))

    def _free_slots(self) -> int:
        """How much to claim now: up to a batch per worker, less what this process holds.

        A batch is as many steps as recent bodies run in ``BATCH_WINDOW`` (at most
        ``BATCH_SIZE``; one when bodies are slow), so claimed work never waits long.
        """
        quick = int(BATCH_WINDOW / self._body_seconds) if self._body_seconds else 1
        per_worker = max(1, min(settings.BATCH_SIZE, quick))
        with self._lock:
            return self.concurrency * per_worker - len(self._held)

    def _sleep_until_due(self, clock: float, look_ahead: bool = False) -> float:
        timeout = min(settings.POLL_INTERVAL.total_seconds(), self._next_heartbeat - clock)
        if self.sweep:
            timeout = min(timeout, self._next_sweep - clock)
        if look_ahead:
            due = self._next_due_at()
            if due is not None:
                timeout = min(timeout, (due - timezone.now()).total_seconds())
        return max(timeout, 0.0)

    def _next_due_at(self) -> datetime | None:
        """The earliest ``scheduled_at`` of a step or job, so a ``wait`` or backoff ending between polls is met."""
        steps = WorkflowStep.objects.filter(status=StepStatus.SCHEDULED, run__status=RunStatus.READY)
        if self.queues is not None:
            steps = steps.filter(queue__in=self.queues)
        jobs = FanOutJob.objects.filter(status=JobStatus.PENDING)
        if self.queues is not None:
            jobs = jobs.filter(queue__in=self.queues)
        times = [qs.aggregate(at=Min("scheduled_at"))["at"] for qs in (steps, jobs)]
        return min((t for t in times if t is not None), default=None)

    def _hand_out(self, claimed: list[Any], *, verify: bool) -> None:
        """Queue claimed work for the workers."""
        if not claimed:
            return
        with self._lock:
            self._held.update(_key(work) for work in claimed)
        with self._has_work:
            self._ready.extend((work, verify) for work in claimed)
            self._has_work.notify(len(claimed))

    def _release(self, works: list[Any]) -> None:
        """This process no longer holds these claims (their outcomes are written)."""
        with self._lock:
            self._held.difference_update(_key(work) for work in works)
        self._wake.set()
        if self._stopping.is_set():
            with self._has_work:
                self._has_work.notify_all()  # idle workers waiting for the last claims may exit

    def _take(self, wait: bool) -> tuple[Any, bool] | None:
        """The next claimed work to run; None when there is none (or, waiting, when stopping)."""
        with self._has_work:
            while not self._ready:
                if not wait or (self._stopping.is_set() and not self._held_unapplied()):
                    return None
                self._has_work.wait(0.5)
            return self._ready.popleft()

    def _held_unapplied(self) -> bool:
        with self._lock:
            return bool(self._held)

    def _worker(self) -> None:
        """Run claimed work; commit the outcomes of several steps together while bodies are quick.

        Outcomes wait for at most ``BATCH_SIZE`` steps or ``BATCH_WINDOW`` seconds; unstarted
        work stays in the shared queue, so a slow body never holds up a step another idle
        worker could run.
        """
        chain = Chain(self.name, self.queues, stop=self._stopping)
        performed: list[tuple[WorkflowStep, StepOutcome]] = []
        opened = 0.0
        try:
            while True:
                taken = self._take(wait=not performed)
                if taken is None:
                    if performed:
                        self._apply(performed, chain)
                        performed = []
                        continue
                    if self._stopping.is_set():
                        return
                    continue
                work, verify = taken
                if isinstance(work, FanOutJob):
                    self._run_job(work, chain)
                    continue
                done = self._perform(work, chain, verify)
                if done is None:
                    continue
                if not performed:
                    opened = time.monotonic()
                performed.append(done)
                if len(performed) >= settings.BATCH_SIZE or time.monotonic() - opened >= BATCH_WINDOW:
                    self._apply(performed, chain)
                    performed = []
        finally:
            connection.close()

    def _perform(self, step: WorkflowStep, chain: Chain, verify: bool) -> tuple[WorkflowStep, StepOutcome] | None:
        """Run one body; the outcome to apply, or None when it is dealt with already."""
        began = time.monotonic()
        try:
            done = perform_step(step, chain=chain, verify=verify)
        except Exception:
            logger.exception("Step %s of run %s could not be finished", step.step_name, step.run_id)
            self._lost([step])
            return None
        self._body_seconds = 0.8 * self._body_seconds + 0.2 * (time.monotonic() - began)
        if isinstance(done, tuple):
            return done
        self._hand_out(chain.take(), verify=False)  # an atomic step's chained step
        self._release([step])
        return None

    def _apply(self, performed: list[tuple[WorkflowStep, StepOutcome]], chain: Chain) -> None:
        """Write the outcomes together; queue the steps their transaction claimed for us."""
        steps = [step for step, _ in performed]
        try:
            apply_outcomes(performed, chain)
        except Exception:
            logger.exception("The outcomes of %d step(s) could not be written", len(steps))
            self._lost(steps)
            return
        self._hand_out(chain.take(), verify=False)
        self._release(steps)

    def _lost(self, steps: list[WorkflowStep]) -> None:
        """Give up claims whose end could not be written: the orphan recovery stalls them."""
        connection.close()
        self._release(steps)
        self._orphans_possible.set()

    def _run_job(self, job: FanOutJob, chain: Chain) -> None:
        """Run a claimed job, then the next ones claimed with each job's end."""
        current: FanOutJob | None = job
        try:
            while current is not None:
                try:
                    execute_job(current, chain=chain)
                except Exception:
                    logger.exception(
                        "Fan-out job %s #%s of run %s could not be finished",
                        current.function,
                        current.index,
                        current.run_id,
                    )
                    connection.close()
                    return
                current, chain.next_job = chain.next_job, None
        finally:
            self._release([job])

    def _recover_after_outage(self) -> None:
        """A claim whose commit we did not see may have committed: stall attempts no worker runs."""
        try:
            with self._lock:
                running = {pk for kind, pk in self._held if kind == "step"}
            recovered = self._stall_own("orphaned_claim", keep=running)
            if recovered:
                logger.warning("Recovered %d step(s) claimed before the connection dropped", recovered)
        except DB_ERRORS:
            connection.close()

    # -- LISTEN/NOTIFY ---------------------------------------------------------------------------

    def _listen(self) -> None:
        """Wake the main thread on every NOTIFY for a served queue; reconnect with backoff."""
        import psycopg
        from psycopg import sql

        backoff = 0.5
        channel = settings.NOTIFY_CHANNEL
        while not self._stopping.is_set():
            try:
                with psycopg.connect(**_listen_params(), autocommit=True) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self._wake.set()  # anything sent while we were away
                    backoff = 0.5
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if self.queues is None or note.payload in self.queues:
                                self._wake.set()
            except psycopg.Error as error:
                logger.warning("LISTEN connection lost (%s); reconnecting in %.1fs", str(error).strip(), backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)


def _key(work: WorkflowStep | FanOutJob) -> tuple[str, int]:
    return ("job", work.pk) if isinstance(work, FanOutJob) else ("step", work.pk)


def _listen_params() -> dict[str, Any]:
    """psycopg connection parameters for the default database, from Django's settings."""
    params = connection.get_connection_params()
    keep = ("dbname", "user", "password", "host", "port", "sslmode", "sslrootcert", "sslcert", "sslkey", "options")
    return {k: v for k, v in params.items() if k in keep and v not in (None, "")}


@contextmanager
def _stop_signals(handler: Any) -> Iterator[None]:
    """Install SIGTERM/SIGINT handlers for the block and restore the previous ones."""
    if threading.current_thread() is not threading.main_thread():
        logger.warning("Not on the main thread: SIGTERM/SIGINT are not handled")
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
