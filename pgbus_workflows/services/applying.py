"""Writing outcomes: several runs' outcomes in one transaction, and what to do when one cannot be written."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

from ..models import WorkflowStep
from .body import log_outcome
from .chain import Chain
from .handle import handle_class
from .locks import locked_steps
from .outcome import StepOutcome, apply_outcome, error_message
from .transactions import CONNECTION_ERRORS, commit_once

logger = logging.getLogger("pgbus_workflows")


def apply_outcomes(
    performed: Sequence[tuple[WorkflowStep, StepOutcome]], chain: Chain | None = None
) -> list[StepOutcome | None]:
    """Apply the outcomes of claimed attempts of different runs, in one transaction.

    Each run is locked and its outcome applied as on its own (:func:`apply_outcome`); the
    writes of all of them are sent together. Returns, per attempt, its outcome, or None
    when the attempt (or its run) was gone. Should one of them fail to apply, each is
    applied in its own transaction instead, so one bad row never holds the others back; an
    outcome that cannot be written at all is replaced by the error that stopped it
    (:func:`apply_instead`), never left for the body to run again. A COMMIT whose answer
    was lost is not applied twice (``commit_once``).
    """
    if not performed:
        return []
    try:
        results, chained = commit_once(partial(_apply_together, performed, chain), on_indexes=True)
    except CONNECTION_ERRORS:
        raise
    except Exception as error:
        if len(performed) > 1:
            logger.exception("Applying %d outcomes together failed; applying them one by one", len(performed))
            return _apply_one_by_one(performed, chain)
        step, outcome = performed[0]
        return [apply_instead(step, outcome, error, chain)]
    if chain is not None:
        chain.next_steps.extend(chained)  # only once their transaction is known to have committed
    for (step, outcome), result in zip(performed, results, strict=True):
        if result is not None:
            log_outcome(step.run, step, outcome)
    return results


def _apply_together(
    performed: Sequence[tuple[WorkflowStep, StepOutcome]], chain: Chain | None
) -> tuple[list[StepOutcome | None], list[WorkflowStep]]:
    """The unit of work of :func:`apply_outcomes`, inside its transaction."""
    results: list[StepOutcome | None] = []
    chained: list[WorkflowStep] = []
    items = [(step.run_id, step.pk, _following(step)) for step, _ in performed]
    with locked_steps(items, savepoint=False) as units:
        for (ledger, locked), (_, outcome) in zip(units, performed, strict=True):
            if ledger is None or locked is None:
                results.append(None)
                continue
            ledger.claim_for = chain
            apply_outcome(ledger, locked, outcome)
            results.append(outcome)
            if chain is not None:
                step = ledger.claim_chained()
                if step is not None:
                    if outcome.checkpoint is not None:  # the function's next row: its checkpoints, in hand
                        step.carried = outcome.checkpoint.carried
                    chained.append(step)
    return results, chained


def apply_instead(
    step: WorkflowStep, outcome: StepOutcome, error: Exception, chain: Chain | None
) -> StepOutcome | None:
    """The outcome of ``step`` could not be written: record ``error`` as the attempt's error.

    The error goes to the exception policy like any body's; should that outcome fail to
    apply too (a ``wait`` callable of the policy that raises), the run pauses with the
    error recorded. The body is never run again for it. Returns the outcome applied.
    """
    logger.error(
        "The %s outcome of step %s of run %s could not be written (%s: %s); recording that error instead",
        outcome.kind,
        step.step_name,
        step.run_id,
        type(error).__name__,
        error_message(error),
    )
    details: dict[str, Any] = {"unwritable_outcome": outcome.kind}
    if outcome.error is not None:
        details["outcome_error_class"] = type(outcome.error).__name__
    for forced in (None, "pause"):
        instead = StepOutcome.from_error(error, forced_action=forced, details=details)
        try:
            results, chained = commit_once(partial(_apply_together, [(step, instead)], chain), on_indexes=True)
        except CONNECTION_ERRORS:
            raise
        except Exception:
            logger.exception("Recording the error of step %s of run %s failed too", step.step_name, step.run_id)
            continue
        if chain is not None:
            chain.next_steps.extend(chained)
        if results[0] is not None:
            log_outcome(step.run, step, instead)
        return results[0]
    raise error


def _apply_one_by_one(
    performed: Sequence[tuple[WorkflowStep, StepOutcome]], chain: Chain | None
) -> list[StepOutcome | None]:
    """Each outcome in its own transaction; the first error is raised once all were tried."""
    results: list[StepOutcome | None] = []
    failure: Exception | None = None
    for item in performed:
        try:
            results.extend(apply_outcomes([item], chain))
        except Exception as error:
            failure = failure or error
            results.append(None)
    if failure is not None:
        raise failure
    return results


def _following(step: WorkflowStep) -> str | None:
    """The name of the step after ``step`` (what its outcome most often schedules)."""
    following = handle_class(step.run.workflow_class).next_step_after(step.step_name)
    return None if following is None else following.name
