"""The dispatcher's worker threads: they run claimed work and commit quick steps' outcomes together.

The dispatcher's loop claims due work and hands it to the pool (a shared queue). Each worker
takes one piece at a time and runs its body; the outcomes of quick steps wait (at most
``BATCH_SIZE`` of them, at most ``BATCH_WINDOW`` seconds) and are then applied in one
transaction, which also claims, for the same worker, the next steps that are due at once.
Those go to the worker's own lane, so a run's steps keep being batched by one worker. Only
outcomes of steps that end together are joined: before a body not known to be quick (its
step's recent bodies took ``QUICK_BODY`` or more on average; a step not seen yet), the
worker writes what it holds; before a quick one it parks them, and should that body run
past ``BATCH_WINDOW`` after all, an idle worker writes them. So no outcome waits behind a
slow body while a worker is free to write it.

A slow body never holds other work up: when a worker has been inside one body for longer
than ``BATCH_WINDOW``, idle workers take the waiting work of its lane. Nothing claimed is
ever waiting in a worker's hands unstarted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, cast

from django.db import connection

from ..models import FanOutJob, WorkflowStep
from ..services.applying import apply_outcomes
from ..services.body import Awaiting, AwaitingBody
from ..services.chain import Chain
from ..services.executor import begin_step
from ..services.fanout import JobEnd, record_job_ends, start_job
from ..services.outcome import StepOutcome
from ..states import StepOutcomeKind
from .coroutines import CoroutineLoop
from .lanes import Batch, Lane, Settled, Work, body_key, work_key
from .taking import BATCH_WINDOW, WorkQueues
from .waker import join_until

logger = logging.getLogger("pgbus_workflows")

#: A step whose bodies take less than this on average is known to be quick: the outcomes its
#: worker holds wait for its body, to be written with its own (an idle worker writes them
#: should it run past ``BATCH_WINDOW`` after all). Before any other body they are written.
QUICK_BODY = 0.1


class WorkerPool:
    """``size`` worker threads serving the claims of one dispatcher.

    It runs the bodies and writes their ends; what it holds in :attr:`taking` (a
    :class:`~.taking.WorkQueues`) hands the claims out and lets its workers take them.
    """

    def __init__(
        self,
        *,
        name: str,
        queues: frozenset[str] | None,
        size: int,
        stopping: threading.Event,
        on_free: Callable[[], None],
        on_lost: Callable[[], None],
        async_capacity: int = 0,
    ) -> None:
        #: The event loop ``async def`` bodies await on (None: a pool without workers).
        self.coroutines = CoroutineLoop(async_capacity, self._hand_back, self._drop) if size else None
        #: The shared queue, the lanes and the held claims: who takes which work.
        self.taking = WorkQueues(
            size=size, stopping=stopping, on_free=on_free, on_lost=on_lost, coroutines=self.coroutines
        )
        self.size = size
        self.name = name
        self.queues = queues
        self._stopping = stopping
        self._on_free = on_free
        self._threads = [self._thread(lane) for lane in self.taking.lanes]
        #: Worker threads that died and were replaced (each logged).
        self.replaced = 0
        #: How long each step's (class and name) or job function's bodies take (a moving
        #: average): a worker writes the outcomes it holds before a body not known to be quick.
        self._step_seconds: dict[tuple[str, str], float] = {}

    def _thread(self, lane: Lane) -> threading.Thread:
        return threading.Thread(target=self._serve, args=(lane,), name=f"pgbus-worker-{lane.number}", daemon=True)

    def start(self) -> None:
        """Start the worker threads (and the event loop for async bodies)."""
        if self.coroutines is not None:
            self.coroutines.start()
        for thread in self._threads:
            thread.start()

    def alive(self) -> int:
        """How many worker threads are alive (the dispatcher's row shows it)."""
        return sum(thread.is_alive() for thread in self._threads)

    def hand_out(self, works: Sequence[Work], *, verify: bool, lane: Lane | None = None) -> None:
        """Queue claimed work for the workers (:meth:`.WorkQueues.hand_out`)."""
        self.taking.hand_out(works, verify=verify, lane=lane)

    def held(self) -> set[tuple[str, int]]:
        """The claims this pool holds: queued, running, or not yet written."""
        return self.taking.held()

    def free_slots(self) -> int:
        """How much to claim now (:meth:`.WorkQueues.free_slots`)."""
        return self.taking.free_slots()

    def join(self, deadline: float) -> bool:
        """Wait (until the ``time.monotonic()`` deadline) for the workers to finish every claim.

        Call after ``stopping`` is set. Returns True when some are still running; the async
        bodies still awaiting are then cancelled (their attempts are the dispatcher's to stall).
        """
        with self.taking.lock:
            self.taking.wake_all()
        for thread in self._threads:
            join_until(thread, deadline)
        abandoned = any(thread.is_alive() for thread in self._threads)
        if self.coroutines is not None:
            self.coroutines.close(cancel=abandoned)
        return abandoned

    def _serve(self, lane: Lane) -> None:
        """One worker thread; should it die anyway, its work is recovered and a new thread takes the lane."""
        chain = Chain(
            self.name, self.queues, stop=self._stopping, others_waiting=partial(self.taking.others_waiting, lane)
        )
        try:
            self._work(lane, chain)
        except BaseException:
            logger.critical("Worker thread %s died; recovering its work and replacing it", lane.number, exc_info=True)
            self._recover(lane, chain)
        finally:
            connection.close()

    def _work(self, lane: Lane, chain: Chain) -> None:
        """Run work; write quick steps' outcomes and jobs' ends in batches."""
        while True:
            taken = self.taking.take(lane, wait=not lane.batch)
            if taken is None:
                if not lane.batch:
                    return
                self._write_batch(lane, chain)
                continue
            work, verify = taken
            if isinstance(work, Batch):  # another worker's, whose body turned out slow
                self._write(work, chain, lane)
                continue
            lane.current = work
            if isinstance(work, Settled):
                self._settle(work, lane)
            else:
                self._before_body(lane, work, chain)
                if isinstance(work, FanOutJob):
                    end = self._run_job(work, lane)
                    self._unpark(lane)
                    lane.batch.add_job(end)
                else:
                    performed = self._perform(work, chain, verify, lane)
                    self._unpark(lane)
                    lane.batch.add_step(performed)
            lane.current = None
            if len(lane.batch) >= self.taking.batch_size or lane.batch.age() >= BATCH_WINDOW:
                self._write_batch(lane, chain)

    def _before_body(self, lane: Lane, work: WorkflowStep | FanOutJob, chain: Chain) -> None:
        """Write what ``lane`` holds before a body not known to be quick; before a quick one, park it.

        Parked, it waits for the body's end to be joined by its outcome; should the body run
        past ``BATCH_WINDOW`` after all, an idle worker writes it meanwhile (``WorkQueues._steal``).
        """
        if not lane.batch:
            return
        if not self._known_quick(work):
            self._write_batch(lane, chain)
            return
        with self.taking.lock:
            lane.parked, lane.batch = lane.batch, Batch()

    def _unpark(self, lane: Lane) -> None:
        """The body is over: what ``lane`` parked before it, unless another worker wrote it, is its batch again."""
        with self.taking.lock:
            parked, lane.parked = lane.parked, None
        if parked is not None:
            parked.join(lane.batch)
            lane.batch = parked

    def _write_batch(self, lane: Lane, chain: Chain) -> None:
        batch, lane.batch = lane.batch, Batch()
        self._write(batch, chain, lane)

    def _recover(self, lane: Lane, chain: Chain) -> None:
        """After a worker thread died: write what it ran, give up what it held, start another.

        Outcomes it ran are written (their bodies do not run again); the claim it was inside
        is given up (the orphan recovery stalls it at once); its queued claims go to the others.
        """
        connection.close()
        self._unpark(lane)
        current, lane.current, lane.body_since = lane.current, None, None
        if lane.batch:
            try:
                self._write_batch(lane, chain)
            except BaseException:
                logger.exception("Could not write the outcomes of worker thread %s", lane.number)
        if current is not None and work_key(current) in self.held():
            self.taking.lost([current])
        with self.taking.lock:
            self.taking.share(list(lane.queue))
            lane.queue.clear()
            self.taking.wake_all()
        if not self._stopping.is_set():
            self.replaced += 1
            thread = self._threads[lane.number] = self._thread(lane)
            thread.start()

    def _known_quick(self, work: Work) -> bool:
        """Whether ``work``'s recent bodies took under ``QUICK_BODY`` on average (settling a coroutine's end does).

        An average, not the slowest: a quick body that waited for the GIL now and then (five
        threads on two cores) would otherwise cost its step its batching.
        """
        if isinstance(work, Settled):
            return True
        return self._step_seconds.get(body_key(work), QUICK_BODY) < QUICK_BODY

    def _enter_body(self, lane: Lane) -> float:
        """Mark ``lane``'s worker as inside a body; an idle worker then times when to take its queue.

        One watcher is enough (sixteen woken for each body would cost each a trip through the
        lock and the GIL), and none is woken when an idle worker looks in time anyway; whoever
        takes work behind a body wakes the next (``WorkQueues.take``).
        """
        lane.body_since = time.monotonic()
        if lane.queue or lane.parked is not None:
            with self.taking.lock:
                if not self.taking.looked_at_by(lane.body_since + BATCH_WINDOW):
                    self.taking.wake_idle(1)
        return lane.body_since

    def _leave_body(self, lane: Lane, began: float, work: WorkflowStep | FanOutJob) -> None:
        """The body is over: its duration goes into the moving average that sizes the claims,
        and into its step's (or job function's) own."""
        lane.body_since = None
        seconds = time.monotonic() - began
        self.taking.body_took(seconds)
        key = body_key(work)
        # The first body sets it: a step seen to be slow once is slow at once, not after five.
        self._step_seconds[key] = 0.8 * self._step_seconds.get(key, seconds) + 0.2 * seconds

    def _perform(
        self, step: WorkflowStep, chain: Chain, verify: bool, lane: Lane
    ) -> tuple[WorkflowStep, StepOutcome] | None:
        """Run one body; the outcome still to apply, or None when it is dealt with already
        (or its coroutine went to the event loop, which hands its end back)."""
        began = self._enter_body(lane)
        try:
            begun = begin_step(step, chain=chain, verify=verify)
            if begun.kind == "to_apply":
                return self._to_apply(step, begun.step or step, cast(StepOutcome, begun.outcome))
            if begun.awaiting is not None:
                if self._submitted(step, begun.awaiting):
                    return None
                held = self._await_held(step, begun.awaiting)  # the loop is full: this thread waits for it
                if held is not None:
                    return self._to_apply(step, begun.awaiting.attempt, cast(StepOutcome, held))
        except BaseException:
            logger.exception("Step %s of run %s could not be finished", step.step_name, step.run_id)
            self.taking.lost([step])
            return None
        finally:
            self._leave_body(lane, began, step)
        self.hand_out(chain.take(), verify=False, lane=lane)  # an atomic step's next step
        self.taking.release([step])
        return None

    def _to_apply(
        self, claimed: WorkflowStep, attempt: WorkflowStep, outcome: StepOutcome
    ) -> tuple[WorkflowStep, StepOutcome]:
        """``outcome`` to write for ``attempt``: a durable function may have moved on from the row claimed.

        That row is given back then (its outcome was written as the function went on).
        """
        if attempt.pk != claimed.pk:
            self.taking.release([claimed])
        return attempt, outcome

    def _submitted(self, claim: WorkflowStep | FanOutJob, awaiting: Awaiting[Any]) -> bool:
        """Whether the event loop took the coroutine: this thread is free, so the loop may claim more."""
        if self.coroutines is None or not self.coroutines.submit(claim, awaiting):
            return False
        self._on_free()
        return True

    def _await_held(self, claim: WorkflowStep | FanOutJob, awaiting: Awaiting[Any]) -> StepOutcome | JobEnd | None:
        """Await the coroutine on the loop past its places, this worker waiting for its end.

        None when it was dropped (its attempt stalled meanwhile): its claim is given up here; or
        when it left nothing to write (a durable function's driver wrote its own).
        """
        settled = cast(CoroutineLoop, self.coroutines).await_held(claim, awaiting)  # a pool with workers has one
        if settled is None:
            self.taking.release([claim])
            return None
        return settled.result()

    def cancel_stalled(self) -> int:
        """Cancel the async bodies whose attempts (or jobs) were stalled meanwhile; how many.

        Their places on the loop are freed and their ends never written (the stall wrote theirs).
        """
        if self.coroutines is None:
            return 0
        claims = self.coroutines.claims()
        steps = [claim.pk for claim in claims if isinstance(claim, WorkflowStep)]
        jobs = {claim.pk: claim.stalls for claim in claims if isinstance(claim, FanOutJob)}
        stalled = [
            ("step", pk)
            for pk in WorkflowStep.objects.filter(pk__in=steps, outcome=StepOutcomeKind.STALLED).values_list(
                "pk", flat=True
            )
        ]
        rows = FanOutJob.objects.filter(pk__in=list(jobs)).values_list("pk", "stalls") if jobs else []
        stalled += [("job", pk) for pk, stalls in rows if stalls > jobs[pk]]
        cancelled = self.coroutines.cancel(stalled, "its attempt was stalled") if stalled else 0
        if cancelled:
            logger.warning("Cancelled %d async bod(ies) whose attempts were stalled meanwhile", cancelled)
        return cancelled

    def _hand_back(self, settled: Settled) -> None:
        """On the loop's thread: a coroutine ended; a worker writes its outcome with its batch."""
        with self.taking.lock:
            self.taking.share([(settled, False)])
            self.taking.wake_idle(1)

    def _drop(self, claim: WorkflowStep | FanOutJob) -> None:
        """On the loop's thread: a body cancelled (stalled, or at shutdown); its claim is given up, not written."""
        self.taking.release([claim])

    def _settle(self, settled: Settled, lane: Lane) -> None:
        """Turn an ended coroutine into its outcome (or job end), written with ``lane``'s batch."""
        try:
            result = settled.result()
        except BaseException:
            logger.exception("The end of %s could not be settled", settled.awaiting.label)
            self.taking.lost([settled])
            return
        if isinstance(result, JobEnd):
            lane.batch.add_job(result)
        elif result is None:  # a durable function's driver applied its outcomes itself
            self.taking.release([settled])
        else:
            attempt = cast(AwaitingBody, settled.awaiting).attempt
            lane.batch.add_step(self._to_apply(cast(WorkflowStep, settled.work), attempt, result))

    def _write(self, batch: Batch, chain: Chain, lane: Lane) -> None:
        """Write the batch (one transaction for the steps, one for the jobs); what their
        transactions claimed for this worker goes to ``lane``."""
        for works, write in (
            (batch.steps, lambda: apply_outcomes(batch.performed, chain)),
            (batch.jobs, lambda: record_job_ends(batch.ends, chain)),
        ):
            if not works:
                continue
            try:
                write()
            except BaseException:
                logger.exception("The ends of %d claimed step(s) or job(s) could not be written", len(works))
                self.taking.lost(works)
                continue
            self.hand_out(chain.take(), verify=False, lane=lane)
            self.taking.release(works)

    def _run_job(self, job: FanOutJob, lane: Lane) -> JobEnd | None:
        """Call a claimed job's function (its end is written with the batch; an async one's when it ends)."""
        began = self._enter_body(lane)
        try:
            started = start_job(job)
            if not isinstance(started, Awaiting):
                return started
            return None if self._submitted(job, started) else cast(JobEnd | None, self._await_held(job, started))
        finally:
            self._leave_body(lane, began, job)
