"""Concurrency slots beyond the claim and the outcome: those a cancelled attempt keeps while its body runs.

A concurrency slot is held by an attempt in progress, and by a cancelled attempt whose body
may still run (``WorkflowStep.holds_slots``): a cancel or a ``resume_at`` of a running step
(:func:`cancel_attempt`) leaves its slots taken, so the next step of the key does not start
beside the body still running. They are given back when the body returns (its outcome is
discarded: :func:`give_back`), when its dispatcher finds it cancelled before the body ran
(``executor.give_back_unrun``), or by the sweep once the attempt is stalled (``services.slot_sweep``).
"""

from __future__ import annotations

from ..dsl.limits import CONCURRENCY, limit_label
from ..models import WorkflowStep
from ..sql import rows
from ..states import StepStatus
from . import limiting
from .ledger import RunLedger


def concurrency_names(step: WorkflowStep) -> list[str]:
    """The concurrency limiters of ``step`` (those whose slots it takes), in its order."""
    return [name for name in step.limiters or () if limit_label(name)[0] == CONCURRENCY]


def cancel_attempt(ledger: RunLedger, step: WorkflowStep, outcome: str) -> None:
    """Cancel the run's active attempt ``step`` from outside its body (an operator's verb).

    An attempt in progress may have its body running on a dispatcher: it keeps its slots
    (``holds_slots``) until the body returns or it is stalled, so a limit of 1 never lets the
    next step of its key start beside it.
    """
    kept = limiting.releases(step, step.status, StepStatus.CANCELLED)
    ledger.move_step(step, "cancel", outcome=outcome, **({"holds_slots": True} if kept else {}))
    for name in kept:
        ledger.releasing.remove(name)


def give_back(ledger: RunLedger, step: WorkflowStep | None) -> bool:
    """Give back the slots a cancelled attempt held for its body, in the ledger's unit of work (False: none)."""
    if step is None or not step.holds_slots:
        return False
    ledger.give_back(concurrency_names(step), step.queue)
    step.holds_slots = False
    if ledger.writes is None:
        rows.update(step, ["holds_slots"])
    else:
        ledger.writes.update(step, ["holds_slots"])
    return True
