"""Who takes which claimed work: the shared queue, each worker's lane, and the idle workers.

``WorkQueues`` is what the worker pool (:mod:`.workers`, which runs the bodies) holds to hand
work out and let its workers take it. The loop's claims go to the shared queue, or straight to the
warmest idle worker; what a worker's own write claims goes to its lane. A worker takes its
lane's work first, then a share of the shared queue, then what waits behind another's slow
body. While bodies are quick, ``AWAKE_FOR_QUICK`` workers take everything, so their outcomes
commit together.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import cast

from django.db import connection

from ..conf import settings
from ..models import FanOutJob, WorkflowStep
from ..services.claims import still_in_progress
from ..services.executor import give_back_unrun
from .coroutines import CoroutineLoop
from .lanes import Batch, Lane, Queued, Work, work_key

logger = logging.getLogger("pgbus_workflows")

#: The longest a worker keeps quick steps' outcomes before committing them together, and
#: how long a body may run before idle workers take the work queued behind it.
BATCH_WINDOW = 0.02
#: How many workers run quick bodies while the others sleep, whatever the pool's size
#: (see ``WorkQueues._leave_to_awake``): as many as the default concurrency.
AWAKE_FOR_QUICK = 4


class WorkQueues:
    """The pool's queues and lanes, under one lock: handing claimed work out and taking it.

    Its interface to the pool: :meth:`hand_out`, :meth:`held` and :meth:`free_slots` (the
    loop's, through the pool); :meth:`take`, :meth:`release`, :meth:`lost`, :meth:`share`,
    :meth:`body_took`, :meth:`wake_idle`, :meth:`wake_all` and :meth:`looked_at_by` (the
    workers'); :attr:`lock`, :attr:`lanes` and :attr:`stopping`.
    """

    def __init__(
        self,
        *,
        size: int,
        stopping: threading.Event,
        on_free: Callable[[], None],
        on_lost: Callable[[], None],
        coroutines: CoroutineLoop | None = None,
    ) -> None:
        self.size = size
        #: The event loop ``async def`` bodies await on (None: they are awaited on the workers).
        self.coroutines = coroutines
        self.batch_size = settings.BATCH_SIZE
        self.stopping = stopping
        self._on_free = on_free  # a claim ended: the loop may claim more
        self._on_lost = on_lost  # a claim's end could not be written: recover orphans
        self._shared: deque[Queued] = deque()
        #: ``time.monotonic()`` since when the shared queue's oldest work has waited (about).
        self._shared_since = 0.0
        #: Guards the queues, the lanes and the held set; each lane's wake-up condition is on it.
        self.lock = threading.RLock()
        #: One lane per worker: its own queue, its batch, whether it is in a body.
        self.lanes = [Lane(n, self.lock) for n in range(size)]
        #: Idle workers' lanes: the one that worked last is woken first (the warmest).
        self._idle: set[Lane] = set()
        # work_key of every claim held: queued, running, or its outcome not yet written.
        self._held: set[tuple[str, int]] = set()
        # How long bodies take (a moving average): sizes the claims so batches stay short.
        self._body_seconds = 0.0

    def held(self) -> set[tuple[str, int]]:
        """The claims this pool holds (queued, running, or not yet written)."""
        with self.lock:
            return set(self._held)

    def free_slots(self) -> int:
        """How much to claim now: a batch per worker, less what is held.

        A batch is as many steps as recent bodies run in ``BATCH_WINDOW`` (at most
        ``BATCH_SIZE``; one when bodies are slow), so claimed work never waits long. While
        work is held, less than a batch is not worth a claim: the next release will do.

        Bodies awaiting in the event loop's places hold no worker: they do not count. While
        those places are all taken, the next async bodies hold their workers (each waits for
        its body on the loop), so a claim is a step per worker.
        """
        quick = int(BATCH_WINDOW / self._body_seconds) if self._body_seconds else 1
        per_worker = max(1, min(self.batch_size, quick))
        awaiting = 0
        if self.coroutines is not None:
            awaiting = self.coroutines.in_flight()
            if self.coroutines.capacity and self.coroutines.full():
                per_worker = 1
        with self.lock:
            free = self.size * per_worker - (len(self._held) - awaiting)
            # Claim a batch's worth or nothing while work is held: fewer, fuller claims.
            return free if free >= per_worker or not self._held else 0

    def hand_out(self, works: Sequence[Work], *, verify: bool, lane: Lane | None = None) -> None:
        """Queue claimed work: on ``lane`` (a worker's own) or for any worker.

        ``verify``: the claims were made by the loop, so one may be cancelled before a worker
        takes it; each is re-checked before its body runs, unless it goes straight to an idle
        worker (see :meth:`_direct_lane`), which starts it the moment the claim committed.
        """
        if not works:
            return
        with self.lock:
            self._held.update(work_key(work) for work in works)
            if lane is not None:
                lane.queue.extend((work, verify) for work in works)
                return  # a lane is filled by its own worker, which is awake: nobody to wake
            direct = self._direct_lane() if verify else None
            if direct is not None:
                self._idle.discard(direct)
                direct.queue.append((works[0], False))
                direct.wakeup.notify()
                works = works[1:]
                if not works:
                    return
            if not self._shared:
                self._shared_since = time.monotonic()
            self._shared.extend((work, verify) for work in works)
            if self._quick_bodies() and self._active() >= AWAKE_FOR_QUICK:
                # The active workers take it; one idle worker times it, should they not in time
                # (when one already does, another woken would only go back to sleep).
                if not self.looked_at_by(self._shared_since + BATCH_WINDOW):
                    self.wake_idle(1)
                return
            # At most one idle worker per claim: waking all of them (16 threads, say) for one
            # step costs every other one a trip through the lock and the GIL for nothing.
            self.wake_idle(len(works))

    def _direct_lane(self) -> Lane | None:
        """The idle worker to hand a claim just made to, or None. Lock held.

        It takes the claim in hand, with no re-check: nothing waits before it (the shared
        queue is empty) and it starts the body as soon as it wakes, an instant after the
        claim committed, so a cancel could only come as late as one during the body. None
        while ``AWAKE_FOR_QUICK`` active workers run quick bodies: they take the work
        (``_leave_to_awake``).
        """
        if not self._idle or self._shared:
            return None
        warmest = max(self._idle, key=lambda lane: lane.came_at)
        if self._quick_bodies() and self._active(besides=warmest) >= AWAKE_FOR_QUICK:
            return None
        return warmest

    def wake_idle(self, count: int) -> None:
        """Wake up to ``count`` idle workers, the one that worked last first (its caches are warm). Lock held."""
        for _ in range(min(count, len(self._idle))):
            warmest = max(self._idle, key=lambda lane: lane.came_at)
            self._idle.discard(warmest)
            warmest.wakeup.notify()

    def wake_all(self) -> None:
        """Wake every idle worker (to see ``stopping``, or a queue behind a body). Lock held."""
        for lane in self.lanes:
            lane.wakeup.notify()

    def share(self, queued: Sequence[Queued]) -> None:
        """Put work in the shared queue, for any worker (a dead worker's lane, an ended coroutine). Lock held."""
        if not self._shared:
            self._shared_since = time.monotonic()
        self._shared.extend(queued)

    def others_waiting(self, lane: Lane) -> bool:
        """Whether ``lane``'s worker has other work: queued for it or for any worker, or ends not yet written.

        A hint read without the lock, as a durable function's call begins (``Chain.others_waiting``).
        """
        return bool(lane.queue or lane.batch or lane.parked is not None or self._shared)

    def body_took(self, seconds: float) -> None:
        """A body ran for ``seconds``: the moving average that sizes the claims and tells quick bodies."""
        self._body_seconds = 0.8 * self._body_seconds + 0.2 * seconds

    def release(self, works: Sequence[Work]) -> None:
        """The claims of ``works`` ended (written, or given up): no longer held; the loop may claim more."""
        with self.lock:
            self._held.difference_update(work_key(work) for work in works)
            if self.stopping.is_set():
                self.wake_all()  # idle workers waiting for the last claims may exit
        self._on_free()

    def take(self, lane: Lane, wait: bool) -> Queued | tuple[Batch, bool] | None:
        """Work for ``lane``'s worker: its own, then shared, then what waits behind a slow body
        (claims, or outcomes parked before it: a batch to write).

        None when there is none and ``wait`` is false, or when stopping and nothing is held.
        """
        woken = False
        lane.came_at = time.monotonic()
        while True:
            with self.lock:
                while True:
                    if lane.queue:
                        return lane.queue.popleft()
                    leave = self._leave_to_awake(lane) if woken and self._shared else None
                    if self._shared and leave is None:
                        chunk = self._share()
                        break
                    stolen, patience = self._steal()
                    if stolen is not None:
                        if any(_behind(other) for other in self.lanes):
                            self.wake_idle(1)  # the next watcher: more waits behind a body
                        return stolen
                    if not wait or (self.stopping.is_set() and not self._held):
                        return None
                    lane.idle = True
                    self._idle.add(lane)
                    timeout = patience if leave is None else min(patience, leave)
                    lane.looks_at = time.monotonic() + timeout
                    try:
                        lane.wakeup.wait(timeout)
                    finally:
                        lane.idle, woken, lane.looks_at = False, True, math.inf
                        self._idle.discard(lane)  # woken by a timeout or by all: not taken by a hand-out
            self._check(chunk, lane)

    def _leave_to_awake(self, lane: Lane) -> float | None:
        """How long a worker just woken leaves the shared work to those already awake; None: it takes it.

        While bodies are quick, ``AWAKE_FOR_QUICK`` active workers run everything, whatever
        the pool's size: each one's outcomes then commit together, where work spread over 16
        threads would cost a commit per step (and the client's CPU, on a small machine). It
        looks again every ``BATCH_WINDOW``, and takes the work once fewer are active (one of
        them has been in a body for longer). The active ones take shared work between their
        bodies, before their writes claim their runs' next steps, so it never waits for
        their chains to end. Call with the lock held.
        """
        if not self._quick_bodies() or self._active(besides=lane) < AWAKE_FOR_QUICK:
            return None
        return BATCH_WINDOW

    def _quick_bodies(self) -> bool:
        """Whether recent bodies took under a tenth of ``BATCH_WINDOW``."""
        return bool(self._body_seconds) and self._body_seconds * 10 <= BATCH_WINDOW

    def _active(self, besides: Lane | None = None) -> int:
        """Workers (but ``besides``'s) awake and not in a body for over ``BATCH_WINDOW``: soon back for work.

        A worker writing its batch is back as soon as the database answers. Lock held.
        """
        since = time.monotonic() - BATCH_WINDOW
        return sum(
            1
            for other in self.lanes
            if other is not besides and not other.idle and (other.body_since is None or other.body_since >= since)
        )

    def looked_at_by(self, when: float) -> bool:
        """Whether an idle worker wakes of itself by ``when`` (``time.monotonic()``) to look for work. Lock held."""
        return any(lane.idle and lane.looks_at <= when + 0.001 for lane in self.lanes)

    def _share(self) -> list[Queued]:
        """This worker's part of the shared queue: an even share among those who take it, at most a batch.

        While bodies are quick, ``AWAKE_FOR_QUICK`` workers take it whatever the pool's size
        (``_leave_to_awake``): shared by all sixteen of a large pool, a claim would be taken a
        step at a time, a re-check (a round trip) per step.
        """
        takers = min(self.size, AWAKE_FOR_QUICK) if self._quick_bodies() else self.size
        count = min(self.batch_size, max(1, len(self._shared) // max(takers, 1)))
        chunk = [self._shared.popleft() for _ in range(count)]
        self._shared_since = time.monotonic()  # what is left has waited from now on, near enough
        return chunk

    def _check(self, chunk: list[Queued], lane: Lane) -> None:
        """Re-check claims (one query for the chunk); queue those still in progress on ``lane``."""
        steps = [work.pk for work, verify in chunk if verify and isinstance(work, WorkflowStep)]
        try:
            alive = still_in_progress(steps)
        except Exception:
            logger.exception("Could not re-check %d claimed step(s)", len(steps))
            self.lost([work for work, _ in chunk])
            return
        gone = [work for work, verify in chunk if verify and isinstance(work, WorkflowStep) and work.pk not in alive]
        with self.lock:
            lane.queue.extend(
                (work, verify and isinstance(work, FanOutJob)) for work, verify in chunk if work not in gone
            )
        if gone:
            self.release(gone)  # cancelled (or stalled) between the claim and now: they never run
            give_back_unrun(gone)

    def _steal(self) -> tuple[Queued | tuple[Batch, bool] | None, float]:
        """Outcomes parked or work queued behind a body running for over ``BATCH_WINDOW``; else how long to wait.

        An idle worker sleeps until new work is handed out, or until the soonest body with
        work behind it has run for ``BATCH_WINDOW`` (at most a second, to see ``stopping``).
        """
        now = time.monotonic()
        patience = 1.0
        for other in self.lanes:
            if _behind(other):
                ripe = cast(float, other.body_since) + BATCH_WINDOW - now
                if ripe >= 0:
                    patience = min(patience, ripe + 0.001)
                elif other.parked is not None:
                    parked, other.parked = other.parked, None
                    return (parked, False), 0.0
                else:
                    return other.queue.pop(), 0.0
        return None, patience

    def lost(self, works: Sequence[Work]) -> None:
        """Give up claims whose end could not be written: the orphan recovery stalls them."""
        connection.close()
        self.release(works)
        self._on_lost()


def _behind(lane: Lane) -> bool:
    """Whether work is queued or outcomes parked behind ``lane``'s body. Lock held."""
    return lane.body_since is not None and (bool(lane.queue) or lane.parked is not None)
