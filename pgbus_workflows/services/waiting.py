"""The waiting state that ``wait_for`` steps (and fan-out steps) share; every move under the run lock.

    park     in_progress -> waiting    the gate found no pending signal      (run: park, or hold)
    wake     waiting -> scheduled      a matching signal arrived, or the wait timed out with
                                       on_timeout="run", or run_now          (run: wake, or hold)
    resolve  waiting -> in_progress    the wait ends with an outcome (timeout, skip): the outcome
                                       is applied as for any attempt         (run: resolve, then ...)

A run that an operator paused stays paused while its step row moves (``hold``): nothing
runs until ``resume()``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from .. import signals
from ..dsl.definitions import coerce_duration
from ..exceptions import ConfigurationError, WaitTimedOut
from ..models import SignalStatus, WorkflowRun, WorkflowSignal, WorkflowStep
from ..states import RunStatus, StepStatus, signal_event
from . import limiting
from .ledger import RunLedger
from .outcome import StepOutcome, apply_outcome


def pending_signal(ledger: RunLedger, names: list[str] | tuple[str, ...]) -> WorkflowSignal | None:
    """The oldest pending signal of the run with one of ``names``, locked."""
    return (
        WorkflowSignal.objects.select_for_update()
        .filter(run_id=ledger.run.pk, status=SignalStatus.PENDING, name__in=list(names))
        .order_by("received_at", "pk")
        .first()
    )


def consume(ledger: RunLedger, signal: WorkflowSignal, step: WorkflowStep) -> None:
    """Mark ``signal`` consumed by ``step`` (once: it is pending and locked)."""
    signal.status = signal_event("consume", signal.status)
    signal.consumed_by = step
    signal.consumed_at = ledger.now
    signal.save(update_fields=["status", "consumed_by", "consumed_at"])
    step.signal = signal
    ledger.event("signal_consumed", step=step, details={"signal": signal.name, "signal_id": signal.pk})


def wait_deadline(workflow: Any, step: WorkflowStep, spec: Any, now: datetime) -> datetime | None:
    """When a ``wait_for`` step parked now stops waiting: ``now`` plus ``wait_timeout``, or what it computes.

    A callable is called with the workflow, a method name on it; either may return a duration
    (a timedelta or seconds, from now), an aware datetime (the deadline itself) or None (no
    deadline for this run). Any other value raises ``TypeError`` naming the step and the value.
    """
    if spec is None:
        return None
    if isinstance(spec, timedelta):
        return now + spec
    value = getattr(workflow, spec)() if isinstance(spec, str) else spec(workflow)
    if value is None:
        return None
    if isinstance(value, datetime):
        if timezone.is_naive(value):
            raise TypeError(f"{_named(workflow, step)} returned a naive datetime {value!r}: give it a time zone")
        return value
    try:
        return now + coerce_duration(value, "wait_timeout")
    except (ConfigurationError, OverflowError):  # OverflowError: a deadline past the year 9999
        raise TypeError(
            f"{_named(workflow, step)} returned {value!r}: a timedelta, a number of seconds (finite, not "
            "negative, ending before the year 9999), an aware datetime or None"
        ) from None


def _named(workflow: Any, step: WorkflowStep) -> str:
    return f"{type(workflow).__qualname__}.{step.step_name}: wait_timeout"


def park(ledger: RunLedger, step: WorkflowStep, names: tuple[str, ...], timeout_at: datetime | None) -> None:
    """No signal yet: the attempt waits until ``timeout_at`` (:func:`wait_deadline`; None: for ever), the run too."""
    ledger.move_step(step, "park", wait_for=list(names), waiting_since=ledger.now, timeout_at=timeout_at, stall_at=None)
    details = {"wait_for": list(names), "timeout_at": timeout_at.isoformat() if timeout_at else None}
    ledger.transition("park", RunStatus.WAITING, kind="step_waiting", step=step, details=details)


def wake(
    ledger: RunLedger,
    step: WorkflowStep,
    *,
    kind: str,
    actor: str | None = None,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
    **fields: Any,
) -> None:
    """Schedule the waiting attempt now (it runs with its signal, or timed out)."""
    ledger.move_step(step, "wake", scheduled_at=ledger.now, **fields)
    ledger.transition("wake", RunStatus.READY, kind=kind, step=step, actor=actor, reason=reason, details=details)
    if ledger.run.status == RunStatus.READY:  # not held by a pause
        ledger.wake(step.queue)


def resolve(ledger: RunLedger, step: WorkflowStep, outcome: StepOutcome, **fields: Any) -> None:
    """End the wait with ``outcome``, applied as for any attempt (a paused run stays paused)."""
    limiting.holds_no_slot(step)  # in progress only until the outcome, in this unit of work: never claimed
    ledger.move_step(step, "resolve", **fields)
    if ledger.run.status == RunStatus.WAITING:
        ledger.transition(
            "resolve", RunStatus.PERFORMING, kind="step_resolved", step=step, details={"outcome": outcome.kind}
        )
    apply_outcome(ledger, step, outcome)


def fire_timeout(ledger: RunLedger, step: WorkflowStep) -> str:
    """Apply the waiting step's ``on_timeout`` now; returns the action."""
    definition = ledger.cls.step_definition(step.step_name)
    if definition is not None and definition.removed:
        # The code removed the step it waited in: move on, as a gravestone does, not time out.
        resolve(ledger, step, StepOutcome("skip", reason="removed step", details={"removed": True}, body_ran=False))
        return "skip"
    action = definition.on_timeout if definition is not None else "pause"
    timeout_at = step.timeout_at or ledger.now
    ledger.event(
        "wait_timed_out",
        step=step,
        details={"wait_for": step.wait_for, "action": action, "timeout_at": timeout_at.isoformat()},
    )
    ledger.send(signals.wait_timed_out, step_name=step.step_name, attempt=step.attempt, action=action)
    if action == "run":
        wake(ledger, step, kind="step_timed_out", details={"action": action}, timed_out=True)
        return action
    since = step.waiting_since.isoformat() if step.waiting_since else "?"
    if action == "pause":
        error = WaitTimedOut(
            f"{step.step_name} waited for {', '.join(step.wait_for or [])} since {since} "
            f"and timed out at {timeout_at.isoformat()}"
        )
        outcome = StepOutcome.from_error(error, forced_action="pause")
    else:
        outcome = StepOutcome(action, reason="wait timed out")
    resolve(ledger, step, outcome, timed_out=True)
    return action


def waiting_step(run: WorkflowRun) -> WorkflowStep | None:
    """The run's waiting attempt, if any."""
    return WorkflowStep.objects.filter(run_id=run.pk, status=StepStatus.WAITING).order_by("pk").last()
