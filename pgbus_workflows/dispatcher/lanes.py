"""What each of a dispatcher's worker threads holds: its lane (own queue, state) and its unwritten batch.

The pool (``workers.py``) decides who runs what; these are the records it keeps per worker.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..models import FanOutJob, WorkflowStep
from ..services.body import Awaiting
from ..services.fanout import JobEnd
from ..services.outcome import StepOutcome

Claim = WorkflowStep | FanOutJob


@dataclass(frozen=True)
class Settled:
    """Claimed work whose coroutine has ended: :meth:`result` is its outcome (or job end) to write."""

    work: Claim
    awaiting: Awaiting[Any]
    value: Any
    error: BaseException | None

    def result(self) -> StepOutcome | JobEnd | None:
        """Settle it (encode the value, resolve the exception): on a worker thread, never on the loop.

        None: nothing to write (a durable function's driver wrote its outcomes as it went).
        """
        return self.awaiting.settle(self.value, self.error)  # type: ignore[no-any-return]


Work = Claim | Settled
#: Claimed work and whether to re-check it before its body runs (a claim by the loop may be
#: cancelled before it starts; a step claimed by the transaction that just ended cannot).
Queued = tuple[Work, bool]


def work_key(work: Work) -> tuple[str, int]:
    """``("step" | "job", pk)``: how the pool tracks a claim (a settled body: its claim's)."""
    if isinstance(work, Settled):
        work = work.work
    return ("job", work.pk) if isinstance(work, FanOutJob) else ("step", work.pk)


def body_key(claim: Claim) -> tuple[str, str]:
    """What a body's duration is remembered by: its step's class and name, or its job's function."""
    if isinstance(claim, FanOutJob):
        return ("job", claim.function)
    run = claim._state.fields_cache.get("run")  # claims come with their run; never a query here
    return (run.workflow_class if run is not None else "", claim.step_name)


class Lane:
    """One worker's own queue (the steps its transactions claimed), what it runs and has not written."""

    def __init__(self, number: int, lock: threading.RLock) -> None:
        self.number = number
        #: What its worker waits on when idle (on the pool's lock): the pool wakes one worker, not all.
        self.wakeup = threading.Condition(lock)
        self.queue: deque[Queued] = deque()
        #: ``time.monotonic()`` when its current body started; None between bodies.
        self.body_since: float | None = None
        #: The claim taken from the queues and neither in ``batch`` nor released yet.
        self.current: Work | None = None
        #: Outcomes and job ends run and not yet written (kept here so a dead thread's are not lost).
        self.batch = Batch()
        #: The batch set aside while its worker runs a body expected to be quick: joined by
        #: that body's end, or written by an idle worker should the body run long after all.
        self.parked: Batch | None = None
        #: Whether its worker waits for work.
        self.idle = False
        #: ``time.monotonic()`` when its worker last came for work (not when a wait merely timed out).
        self.came_at = 0.0
        #: ``time.monotonic()`` when its idle worker wakes of itself to look for work (inf while awake).
        self.looks_at = math.inf


class Batch:
    """What a worker ran and has not written yet: steps' outcomes and jobs' ends."""

    def __init__(self) -> None:
        self.performed: list[tuple[WorkflowStep, StepOutcome]] = []
        self.ends: list[JobEnd] = []
        self._opened = 0.0

    @property
    def steps(self) -> list[WorkflowStep]:
        """The attempts whose outcomes wait to be written."""
        return [step for step, _ in self.performed]

    @property
    def jobs(self) -> list[FanOutJob]:
        """The fan-out jobs whose ends wait to be written."""
        return [end.job for end in self.ends]

    def add_step(self, performed: tuple[WorkflowStep, StepOutcome] | None) -> None:
        """Add an attempt and its outcome to write; None adds nothing."""
        if performed is not None:
            self._open()
            self.performed.append(performed)

    def add_job(self, end: JobEnd | None) -> None:
        """Add a job's end to write; None adds nothing."""
        if end is not None:
            self._open()
            self.ends.append(end)

    def join(self, later: Batch) -> None:
        """Add what ``later`` holds (ended after this batch's own)."""
        if later and not self:
            self._opened = later._opened
        self.performed.extend(later.performed)
        self.ends.extend(later.ends)

    def _open(self) -> None:
        if not self:
            self._opened = time.monotonic()

    def age(self) -> float:
        """Seconds since the first end still unwritten (0 when empty)."""
        return time.monotonic() - self._opened if self else 0.0

    def __len__(self) -> int:
        return len(self.performed) + len(self.ends)
