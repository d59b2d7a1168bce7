"""A durable function's call ended at the new checkpoint it ran: that checkpoint's outcome, written with others.

A dispatcher's worker that holds other work tells the function's call so
(``StepContext.others_waiting``): the function then runs a new checkpoint's body and goes on
in memory only to its next new checkpoint (or its return), where the call ends with a
``success`` carrying a :class:`CheckpointEnd`. The worker writes it in its batch, in the same
transaction as other runs' outcomes, and that transaction claims the row that carries the
function on for the same worker, handing it the recorded checkpoints (:attr:`carried`), so the
next call replays them without a query. A function that returned finishes its run in the same
write, as a workflow's last step does: one outcome per checkpoint, as one per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .. import signals
from ..dsl.limits import declared_limits
from ..models import WorkflowStep
from ..sql import rows
from ..states import RunStatus, StepOutcomeKind, StepStatus
from .outcome import StepOutcome, continue_after

if TYPE_CHECKING:
    from .ledger import RunLedger


@dataclass(frozen=True)
class CheckpointEnd:
    """What a function's call that ended at its checkpoint writes besides the checkpoint's output."""

    #: ``(checkpoint, attempt)`` the row takes with its outcome (it ran under the function's
    #: row's name), or None for a row that bears the checkpoint's name already.
    renamed: tuple[str, int] | None
    #: The attempt of the row that carries the function on (as :data:`renamed` makes it the
    #: next), or None to number it from the rows.
    entry_attempt: int | None
    #: The checkpoints recorded once this commits, handed to the row the outcome chains.
    carried: Any
    #: The function returned: the run finishes with :attr:`result` in the same write.
    finished: bool = False
    #: The function's return, encoded (with :attr:`finished`).
    result: Any = None

    def apply(self, ledger: RunLedger, step: WorkflowStep, outcome: StepOutcome) -> None:
        """Complete checkpoint ``step`` (renamed), then go on to the function's next row, or finish the run.

        A run paused meanwhile goes on as after any step (its next row held): the function
        returns again when resumed.
        """
        named = {} if self.renamed is None else {"step_name": self.renamed[0], "attempt": self.renamed[1]}
        following = ledger.cls.next_step_after(self.renamed[0] if self.renamed else step.step_name)
        if following is not None and self.entry_attempt is not None:
            ledger.next_attempts[following.name] = self.entry_attempt
        ledger.move_step(step, "complete", outcome=StepOutcomeKind.SUCCESS, output=outcome.output, **named)
        if (
            not self.finished
            or following is None
            or ledger.run.status != RunStatus.PERFORMING
            or declared_limits(ledger.cls, following)  # a row under limits is claimed under them
        ):
            continue_after(ledger, step, kind="step_completed", details=outcome.details)
            return
        # As after a workflow's last step, one transition; on the function's row, which holds the result.
        final = self._returned(ledger, step, following)
        details = {"last_step_outcome": step.outcome, "checkpoint": step.step_name, **outcome.details}
        ledger.transition("finish", RunStatus.FINISHED, kind="finished", step=final, details=details)

    def _returned(self, ledger: RunLedger, step: WorkflowStep, following: Any) -> WorkflowStep:
        """The function's row that returned, inserted completed with the result (the run's result is its output)."""
        final = ledger.new_attempt(following, ledger.next_attempts.pop(following.name, 1), timedelta(0))
        final.status, final.outcome, final.output = StepStatus.COMPLETED, StepOutcomeKind.SUCCESS, self.result
        final.started_at = final.finished_at = ledger.now
        final.claimed_by = step.claimed_by
        if ledger.writes is not None:
            ledger.writes.inserts.append(final)
        else:
            rows.insert(final, {})
        ledger.set_run(current_step=following.name)
        ledger.send(signals.step_finished, step_name=final.step_name, attempt=final.attempt, status=final.status,
                    outcome=final.outcome, error_class="", duration=0.0)  # fmt: skip
        return final
