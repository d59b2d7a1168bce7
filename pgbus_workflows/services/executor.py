"""Running claimed steps (claims are made in ``services.claims``).

``execute_step`` runs a claimed attempt: the guards, then the body outside any transaction
(inside the outcome's transaction for ``atomic=True``), then ``apply_outcome`` under the run
lock. A dispatcher worker does the same in two halves: ``perform_step`` for each body, then
``apply_outcomes`` for the outcomes of several runs in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from .. import tracing
from ..dsl.declared import registry
from ..exceptions import StepNotDefined
from ..models import WorkflowStep
from ..states import StepStatus
from . import slots, waiting
from .applying import apply_outcomes
from .atomic import execute_atomic
from .body import AwaitingBody, start_body
from .chain import Chain
from .claims import claim_due_steps, still_in_progress
from .context import StepContext
from .handle import handle_class
from .locks import locked_step
from .outcome import StepOutcome
from .transactions import with_reconnect

if TYPE_CHECKING:
    from .handle import RunHandle


def run_due_steps(limit: int = 100, queues: Iterable[str] | None = None, claimed_by: str = "") -> int:
    """Claim and run due steps one batch at a time until none is due; returns how many ran."""
    ran = 0
    while True:
        claimed = claim_due_steps(min(limit - ran, 100), queues, claimed_by)
        for step in claimed:
            execute_step(step)
        ran += len(claimed)
        if not claimed or ran >= limit:
            return ran


def execute_step(step: WorkflowStep, *, chain: Chain | None = None, verify: bool = True) -> StepOutcome | None:
    """Run a claimed (in-progress) attempt and apply its outcome; returns the outcome.

    Exceptions from the body never escape: they become an ``error`` outcome that the
    exception policy resolves. Returns None when the attempt was no longer in progress.
    Writing the outcome is retried when the database connection drops (outside a
    transaction of the caller's), so an attempt that ran is not left claimed. ``verify=False``
    skips the re-read of a step claimed by this very caller an instant ago (a chained step).
    """
    done = perform_step(step, chain=chain, verify=verify)
    if isinstance(done, StepOutcome):
        return done
    if done is None:
        return None
    return apply_outcomes([done], chain)[0]


def perform_step(
    step: WorkflowStep, *, chain: Chain | None = None, verify: bool = True
) -> tuple[WorkflowStep, StepOutcome] | StepOutcome | None:
    """Run a claimed attempt's guards and body, leaving its outcome to :func:`apply_outcomes`.

    Returns ``(step, outcome)`` for the caller to apply (alone or with others); an outcome
    already applied (an ``atomic=True`` body commits with its outcome); or None when there
    is nothing to apply (the attempt was no longer in progress, it parked for a signal, or a durable
    function's driver applied its outcomes itself).
    An ``async def`` body is awaited on this thread.
    """
    begun = begin_step(step, chain=chain, verify=verify)
    if begun.awaiting is not None:
        outcome = begun.awaiting.run_here()
        return None if outcome is None else (begun.awaiting.attempt, outcome)
    if begun.kind == "to_apply":
        return begun.step or step, cast(StepOutcome, begun.outcome)
    return begun.outcome  # applied already, or None


@dataclass(frozen=True, slots=True)
class Begun:
    """What beginning a claimed attempt came to (:func:`begin_step`); ``kind`` says which.

    - ``"nothing"``: nothing to apply: the attempt was no longer in progress, it parked for a
      signal, or an ``atomic=True`` body stalled;
    - ``"applied"``: an ``atomic=True`` body committed with its :attr:`outcome`;
    - ``"to_apply"``: its :attr:`outcome` is for the caller to apply (``apply_outcomes``);
    - ``"awaiting"``: an ``async def`` body's coroutine, :attr:`awaiting`, not yet awaited (it
      says which attempt its outcome is for once settled: a durable function's may move on).
    """

    kind: Literal["nothing", "applied", "to_apply", "awaiting"]
    #: The outcome of ``"applied"`` and ``"to_apply"``.
    outcome: StepOutcome | None = None
    #: The coroutine of ``"awaiting"``, which settles into the outcome to apply.
    awaiting: AwaitingBody | None = None
    #: The attempt the outcome is for, when not the one begun: a durable function's driver
    #: records the claimed attempt's checkpoints and goes on on a row of its own (``functions``).
    step: WorkflowStep | None = None


#: Nothing to apply (one instance: it carries nothing).
NOTHING = Begun("nothing")


def begin_step(step: WorkflowStep, *, chain: Chain | None = None, verify: bool = True) -> Begun:
    """:func:`perform_step`, but an ``async def`` body comes back as its coroutine, not yet awaited.

    The dispatcher awaits it on its event loop and settles it on a worker thread.
    """
    if verify and not _still_in_progress(step):
        give_back_unrun([step])  # cancelled (or stalled) between the claim and now: nothing runs
        return NOTHING
    with tracing.attempt_span(step) as span:
        begun = _attempt(step, chain)
        if begun.awaiting is not None:
            span.settles_later(begun.awaiting)
        else:
            span.ended(begun.outcome)
    return begun


def _attempt(step: WorkflowStep, chain: Chain | None) -> Begun:
    """The guards and the body of a claimed attempt known to be in progress (:func:`begin_step`)."""
    run = step.run
    cls = handle_class(run.workflow_class)
    workflow = cls(run)
    definition = cls.step_definition(step.step_name)
    outcome = _guard(workflow, step)
    if outcome is None and definition is not None and definition.atomic:
        applied = execute_atomic(workflow, step, chain)
        return NOTHING if applied is None else Begun("applied", outcome=applied)
    context = StepContext(step=step, others_waiting=chain is not None and _others_waiting(chain))
    if outcome is None and definition is not None and definition.wait_for:
        gate = with_reconnect(lambda: _gate(workflow, step, definition.wait_for, definition.wait_timeout))
        if gate is None:
            return NOTHING  # parked until a signal, or no longer in progress
        if isinstance(gate, StepOutcome):
            return Begun("to_apply", outcome=gate)  # its wait_timeout could not be computed
        context = gate
    if outcome is None:
        started = start_body(workflow, context)
        if context.applied:  # a durable function's driver applied its checkpoints' outcomes itself
            return NOTHING
        # ``context.step``: a durable function's driver may have moved on to another row.
        if isinstance(started, AwaitingBody):
            return Begun("awaiting", awaiting=started, step=context.step)
        return Begun("to_apply", outcome=started, step=context.step)
    return Begun("to_apply", outcome=outcome)


def _others_waiting(chain: Chain) -> bool:
    return chain.others_waiting is not None and chain.others_waiting()


def _still_in_progress(step: WorkflowStep) -> bool:
    return bool(still_in_progress([step.pk]))


def _guard(workflow: RunHandle, step: WorkflowStep) -> StepOutcome | None:
    """The claim guards in pgbus's order; None when the body may run.

    The subject first (a run about a deleted row is cancelled), then the definition (a
    gravestone skips on, an unknown step pauses), then ``cancel_if``, then ``skip_if``.
    """
    cls = type(workflow)
    try:
        if workflow.record.subject_type and workflow.subject is None and not cls.allow_missing_subject:
            return StepOutcome(
                "cancel",
                reason=f"subject {workflow.record.subject_type} {workflow.record.subject_id} no longer exists",
                body_ran=False,
            )
    except BaseException as error:
        return StepOutcome.from_error(error, precondition=True, body_ran=False)
    definition = cls.step_definition(step.step_name)
    if definition is None:
        undefined = StepNotDefined(
            f"Step {step.step_name!r} is not defined in {workflow.record.workflow_class}"
            + (
                ""
                if registry.get(workflow.record.workflow_class)
                else " (the class is not registered: was it deleted or renamed?)"
            )
        )
        return StepOutcome.from_error(undefined, forced_action="pause", body_ran=False)
    if definition.removed:
        return StepOutcome("skip", reason="removed step", details={"removed": True}, body_ran=False)
    try:
        if workflow.cancel_if():
            return StepOutcome("cancel", reason="cancel_if", body_ran=False)
        if _skip_if(workflow, definition.skip_if):
            return StepOutcome("skip", reason="skip_if", body_ran=False)
    except BaseException as error:
        return StepOutcome.from_error(error, precondition=True, body_ran=False)
    return None


def _skip_if(workflow: RunHandle, condition: Any) -> bool:
    if condition is None:
        return False
    if isinstance(condition, bool):
        return condition
    if isinstance(condition, str):
        return bool(getattr(workflow, condition)())
    return bool(condition(workflow))


def _gate(
    workflow: RunHandle, step: WorkflowStep, names: tuple[str, ...], timeout: Any
) -> StepContext | StepOutcome | None:
    """A ``wait_for`` step runs with the signal that woke it, a pending one, or timed out; else it parks.

    The deadline is computed as it parks (``waiting.wait_deadline``); one that cannot be is the
    step's error, as a failing ``skip_if`` is.
    """
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is None or locked.status != StepStatus.IN_PROGRESS:
            slots.give_back(ledger, locked)  # cancelled before its body ran
            return None
        if locked.signal_id is not None:
            return StepContext(step=locked, received_signal=locked.signal)
        if locked.timed_out:
            return StepContext(step=locked, timed_out=True)
        signal = waiting.pending_signal(ledger, names)
        if signal is not None:
            waiting.consume(ledger, signal, locked)
            locked.save(update_fields=["signal"])
            return StepContext(step=locked, received_signal=signal)
        try:
            timeout_at = waiting.wait_deadline(workflow, locked, timeout, ledger.now)
        except BaseException as error:
            return StepOutcome.from_error(error, precondition=True, body_ran=False)
        waiting.park(ledger, locked, names, timeout_at)
        return None


def give_back_unrun(steps: Iterable[WorkflowStep]) -> None:
    """Give back the slots of claimed attempts found cancelled before their body ran (one unit of work each).

    Attempts under no concurrency key cost nothing: no query.
    """
    for step in steps:
        if slots.concurrency_names(step):
            with locked_step(step.run_id, step.pk) as (ledger, locked):
                slots.give_back(ledger, locked)
