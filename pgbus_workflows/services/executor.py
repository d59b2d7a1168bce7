"""Running claimed steps (claims are made in ``services.claims``).

``execute_step`` runs a claimed attempt: the guards, then the body outside any transaction
(inside the outcome's transaction for ``atomic=True``), then ``apply_outcome`` under the run
lock. A dispatcher worker does the same in two halves: ``perform_step`` for each body, then
``apply_outcomes`` for the outcomes of several runs in one transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction

from ..definitions import Job
from ..exceptions import StepNotDefined
from ..models import FanOutJob, WorkflowRun, WorkflowStep
from ..states import StepStatus
from ..step_body import FlowControl, StepContext
from ..workflow import Workflow
from . import waiting
from .claims import claim_due_steps, still_in_progress
from .ledger import locked_step, locked_steps, workflow_class
from .outcome import StepOutcome, apply_outcome
from .payload import encode_payload

logger = logging.getLogger("pgbus_workflows")
T = TypeVar("T")


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

    def take(self) -> list[WorkflowStep | FanOutJob]:
        """The chained steps and jobs (already claimed), once."""
        work: list[WorkflowStep | FanOutJob] = [*self.next_steps, *self.next_jobs]
        self.next_steps, self.next_jobs = [], []
        return work


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
    is nothing to apply (the attempt was no longer in progress, or it parked for a signal).
    """
    if verify and not _still_in_progress(step):
        return None  # cancelled (or stalled) between the claim and now: nothing runs
    run = step.run
    cls = workflow_class(run)
    workflow = cls(run)
    definition = cls.step_definition(step.step_name)
    outcome = _guard(workflow, step)
    if outcome is None and definition is not None and definition.atomic:
        return with_reconnect(lambda: _execute_atomic(workflow, step, chain))
    context = StepContext(step=step)
    if outcome is None and definition is not None and definition.wait_for:
        gate = with_reconnect(lambda: _gate(step, definition.wait_for, definition.wait_timeout))
        if gate is None:
            return None  # parked until a signal, or no longer in progress
        context = gate
    if outcome is None:
        outcome = _run_body(workflow, context)
    return step, outcome


def _still_in_progress(step: WorkflowStep) -> bool:
    return bool(still_in_progress([step.pk]))


def apply_outcomes(
    performed: Sequence[tuple[WorkflowStep, StepOutcome]], chain: Chain | None = None
) -> list[StepOutcome | None]:
    """Apply the outcomes of claimed attempts of different runs, in one transaction.

    Each run is locked and its outcome applied as on its own (:func:`apply_outcome`); the
    writes of all of them are sent together. Returns, per attempt, its outcome, or None
    when the attempt (or its run) was gone. Should one of them fail to apply, each is
    applied in its own transaction instead, so one bad row never holds the others back.
    """
    if not performed:
        return []

    def apply() -> tuple[list[StepOutcome | None], list[WorkflowStep]]:
        results: list[StepOutcome | None] = []
        chained: list[WorkflowStep] = []
        items = [(step.run_id, step.pk, _following(step)) for step, _ in performed]
        with locked_steps(items) as units:
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
                        chained.append(step)
        return results, chained

    try:
        results, chained = with_reconnect(apply)
    except (OperationalError, InterfaceError):
        raise
    except Exception:
        if len(performed) == 1:
            raise
        logger.exception("Applying %d outcomes together failed; applying them one by one", len(performed))
        return _apply_one_by_one(performed, chain)
    if chain is not None:
        chain.next_steps.extend(chained)
    for (step, outcome), result in zip(performed, results, strict=True):
        if result is not None:
            _log(step.run, step, outcome)
    return results


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
    following = workflow_class(step.run).next_step_after(step.step_name)
    return None if following is None else following.name


def with_reconnect(work: Callable[[], T], attempts: int = 6) -> T:
    """Run ``work``; when the connection drops, reconnect with backoff and run it again.

    Inside a caller's transaction nothing can be retried, so the error is raised at once.
    """
    delay = 0.2
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except (OperationalError, InterfaceError):
            if connection.in_atomic_block or attempt == attempts:
                raise
            logger.warning("Database connection lost; reconnecting in %.1fs (attempt %d)", delay, attempt)
            connection.close()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


class _RollBack(Exception):
    def __init__(self, outcome: StepOutcome) -> None:
        super().__init__(outcome.kind)
        self.outcome = outcome


def _execute_atomic(workflow: Workflow, step: WorkflowStep, chain: Chain | None) -> StepOutcome | None:
    """Run the body inside the outcome's transaction: its writes commit with it, or not at all."""
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is None or locked.status != StepStatus.IN_PROGRESS:
            return None
        workflow.record = ledger.run
        try:
            with transaction.atomic():
                outcome = _run_body(workflow, StepContext(step=locked))
                if outcome.kind == "error":
                    raise _RollBack(outcome)
                outcome = _check_deferred_constraints(outcome)
        except _RollBack as rollback:
            outcome = rollback.outcome
        ledger.claim_for = chain
        apply_outcome(ledger, locked, outcome)
        if chain is not None:
            step_after = ledger.claim_chained()
            if step_after is not None:
                chain.next_steps.append(step_after)
    _log(step.run, step, outcome)
    return outcome


def _check_deferred_constraints(outcome: StepOutcome) -> StepOutcome:
    """Check the body's deferred constraints (Django's foreign keys) now, inside its savepoint.

    Otherwise a dangling foreign key would only fail at the outcome's COMMIT, after the
    outcome was applied: the error must roll the body back and go to the policy instead.
    """
    if connection.vendor != "postgresql":
        return outcome
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
    except IntegrityError as error:
        raise _RollBack(StepOutcome.from_error(error)) from error
    return outcome


def _guard(workflow: Workflow, step: WorkflowStep) -> StepOutcome | None:
    """The claim guards in pgbus's order; None when the body may run.

    The subject first (a run about a deleted row is cancelled), then the definition (a
    gravestone skips on, an unknown step pauses), then ``cancel_if``, then ``skip_if``.
    """
    cls = type(workflow)
    try:
        if workflow.record.subject_type and workflow.subject is None and not cls.allow_missing_subject:
            return StepOutcome(
                "cancel", reason=f"subject {workflow.record.subject_type} {workflow.record.subject_id} no longer exists"
            )
    except Exception as error:
        return StepOutcome.from_error(error, precondition=True)
    definition = cls.step_definition(step.step_name)
    if definition is None:
        undefined = StepNotDefined(
            f"Step {step.step_name!r} is not defined in {workflow.record.workflow_class}"
            + ("" if cls is not Workflow else " (the class is not registered: was it deleted or renamed?)")
        )
        return StepOutcome.from_error(undefined, forced_action="pause")
    if definition.removed:
        return StepOutcome("skip", reason="removed step", details={"removed": True})
    try:
        if workflow.cancel_if():
            return StepOutcome("cancel", reason="cancel_if")
        if _skip_if(workflow, definition.skip_if):
            return StepOutcome("skip", reason="skip_if")
    except Exception as error:
        return StepOutcome.from_error(error, precondition=True)
    return None


def _skip_if(workflow: Workflow, condition: Any) -> bool:
    if condition is None:
        return False
    if isinstance(condition, bool):
        return condition
    if isinstance(condition, str):
        return bool(getattr(workflow, condition)())
    return bool(condition(workflow))


def _gate(step: WorkflowStep, names: tuple[str, ...], timeout: Any) -> StepContext | None:
    """A ``wait_for`` step runs with the signal that woke it, a pending one, or timed out; else it parks."""
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is None or locked.status != StepStatus.IN_PROGRESS:
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
        waiting.park(ledger, locked, names, timeout)
        return None


def _run_body(workflow: Workflow, context: StepContext) -> StepOutcome:
    """Call the step body with the step context set; never raises."""
    step = context.step
    definition = type(workflow).step_definition(step.step_name)
    if definition is None or definition.func is None:  # the guards ruled this out
        raise StepNotDefined(step.step_name)
    workflow._context = context
    try:
        try:
            value = definition.func(workflow)
        except FlowControl as flow:
            if flow.kind != "output":
                return StepOutcome(flow.kind, wait=flow.wait, reason=flow.reason)
            value = flow.value
        if definition.kind == "fan_out":
            return StepOutcome("fan_out", jobs=_encode_jobs(step.step_name, value))
        output = None if value is None else encode_payload(value, f"{step.step_name} output")
        return StepOutcome("success", output=output)
    except FlowControl as flow:  # a verb called while encoding the output (a custom encoder)
        return StepOutcome(flow.kind, wait=flow.wait, reason=flow.reason)
    except Exception as error:
        return StepOutcome.from_error(error)
    finally:
        workflow._context = None


def _encode_jobs(step_name: str, value: Any) -> list[tuple[str, Any]]:
    """A fan-out body's return value as stored jobs; anything else is a clear error."""
    if value is None or isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
        raise TypeError(f"fan-out step {step_name} must return an iterable of Job, got {type(value).__name__}")
    jobs = []
    for index, job in enumerate(value):
        if not isinstance(job, Job):
            raise TypeError(f"fan-out step {step_name} returned {job!r} at index {index}, not a Job")
        arguments = encode_payload({"args": job.args, "kwargs": job.kwargs}, f"arguments of {job.path} #{index}")
        jobs.append((job.path, arguments))
    return jobs


def _log(run: WorkflowRun, step: WorkflowStep, outcome: StepOutcome) -> None:
    if outcome.kind == "error":
        logger.warning(
            "Step failed: %s %s step %s attempt %s: %s: %s",
            run.workflow_class,
            run.workflow_id,
            step.step_name,
            step.attempt,
            type(outcome.error).__name__,
            outcome.error,
        )
