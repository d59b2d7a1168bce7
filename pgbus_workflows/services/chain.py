"""The chain: lets an outcome's transaction claim the next steps for the worker that ran the body.

A module of its own (not beside the body's call in ``body.py``) because the writers that fill
it (``ledger``, ``fanout``, ``applying``) and the worker pool that empties it need only it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..models import FanOutJob, WorkflowStep


@dataclass
class Chain:
    """Lets the outcomes' transaction claim the next steps for the same worker.

    When an attempt ends and the next step is due at once in a queue this worker serves,
    it is created already claimed in the same transaction (no claim round trip, no NOTIFY)
    and left in ``next_steps`` for the worker to run straight away.
    """

    claimed_by: str
    queues: frozenset[str] | None = None
    next_steps: list[WorkflowStep] = field(default_factory=list)
    #: The fan-out jobs claimed with the ends of the previous ones (services.fanout.record_job_ends).
    next_jobs: list[FanOutJob] = field(default_factory=list)
    #: Set when the worker stops taking work (a dispatcher shutting down).
    stop: threading.Event | None = None
    #: The holds in force (``(kind, name)``), read by the batch's first chain and forgotten by
    #: :meth:`take`: one read a batch, so a hold placed meanwhile stops the next batch's chains.
    holds: frozenset[tuple[str, str]] | None = None
    #: Whether the worker holds other work to run or write (set by a dispatcher's pool): an
    #: attempt begun then is told so (``StepContext.others_waiting``).
    others_waiting: Callable[[], bool] | None = None

    def take(self) -> list[WorkflowStep | FanOutJob]:
        """The chained steps and jobs (already claimed), once."""
        work: list[WorkflowStep | FanOutJob] = [*self.next_steps, *self.next_jobs]
        self.next_steps, self.next_jobs, self.holds = [], [], None
        return work
