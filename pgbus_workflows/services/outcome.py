"""What an attempt caused: :class:`StepOutcome`, applied to the rows by :func:`apply_outcome`.

The executor turns a body's return, verb or exception into a ``StepOutcome``; the sweep and
the operator verbs make outcomes too. ``apply_outcome`` runs under the run's lock and is
the one place where an in-progress attempt ends.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..conf import settings
from ..dsl.definitions import OnException, StepDefinition, coerce_duration, resolve_policy, resolve_wait
from ..exceptions import StepNotDefined, StepStalled
from ..models import FanOutJob, WorkflowSignal, WorkflowStep
from ..sql import rows
from ..states import SIGNAL_EVENTS, RunStatus, StepOutcomeKind, StepStatus
from . import slots
from .children import open_children
from .ledger import RunLedger
from .payload import storable_text

#: Why an attempt was reattempted; only the error reasons count towards max_reattempts.
ERROR_REATTEMPT_REASONS = ("exception_policy", "precondition")
#: The reattempt reason of an attempt stalled and run again (they count towards MAX_STALLS).
STALL_REATTEMPT = "stall"

OUTCOME_KINDS = ("success", "finished", "reattempt", "skip", "pause", "cancel", "error", "fan_out", "stall")


@dataclass
class StepOutcome:
    """How an attempt ended. ``kind`` is one of :data:`OUTCOME_KINDS`."""

    kind: str
    output: Any = None
    wait: Any = None
    reason: str | None = None
    error: BaseException | None = None
    traceback: str = ""
    #: The error came from cancel_if / skip_if / loading the subject, not the body.
    precondition: bool = False
    #: An action that overrides the exception policies (an undefined step always pauses).
    forced_action: str | None = None
    actor: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: A fan-out body's jobs, as ``(dotted path, {"args": [...], "kwargs": {...}})``.
    jobs: list[tuple[str, Any]] = field(default_factory=list)
    #: A fan-out body's children (``services.children.ChildStart``), started when the step parks.
    children: list[Any] = field(default_factory=list)
    #: False when the attempt ended before its body ran (a guard, a gravestone, an unknown
    #: step): a signal it consumed goes back to pending, for the step that will run.
    body_ran: bool = True
    #: Set as an error is applied when its policy reattempts: (reattempt number, max_reattempts, wait).
    reattempt: tuple[int, int | None, timedelta] | None = None
    #: A ``success`` that ends a durable function's call at the checkpoint it ran: what it writes
    #: besides (a ``services.checkpoint_end.CheckpointEnd``, which imports this module).
    checkpoint: Any = None

    @classmethod
    def from_error(cls, error: BaseException, **kwargs: Any) -> StepOutcome:
        """An ``error`` outcome carrying the exception and its formatted traceback."""
        text = "".join(tb.format_exception(type(error), error, error.__traceback__))
        return cls("error", error=error, traceback=storable_text(text), **kwargs)


def error_message(error: BaseException) -> str:
    """``str(error)`` as a text column can hold it; never raises (a broken ``__str__`` is named)."""
    try:
        return storable_text(str(error))
    except Exception:
        return f"<{type(error).__name__}.__str__ failed>"


def apply_outcome(ledger: RunLedger, step: WorkflowStep, outcome: StepOutcome) -> None:
    """End the in-progress attempt ``step`` with ``outcome`` and move the run on.

    An attempt that is no longer in progress (cancelled, or stalled by the sweep while it
    ran) keeps its state: the late outcome is only recorded as ``outcome_discarded`` (and a
    cancelled attempt's slots are given back: its body is over).
    """
    if step.status != StepStatus.IN_PROGRESS:
        ledger.event(
            "outcome_discarded",
            step=step,
            details={"outcome": outcome.kind, "step_status": step.status, **_error_details(outcome)},
        )
        slots.give_back(ledger, step)  # a cancelled attempt kept its slots while its body ran
        return
    definition = ledger.cls.step_definition(step.step_name)
    actor, reason = outcome.actor, outcome.reason
    if not outcome.body_ran and step.signal_id is not None:
        return_signal(ledger, step, outcome.kind)
    if outcome.kind == "success" and outcome.checkpoint is not None:
        outcome.checkpoint.apply(ledger, step, outcome)
    elif outcome.kind == "success":
        ledger.move_step(step, "complete", outcome=StepOutcomeKind.SUCCESS, output=outcome.output)
        continue_after(ledger, step, kind="step_completed", actor=actor, reason=reason, details=outcome.details)
    elif outcome.kind == "finished":
        ledger.move_step(step, "complete", outcome=StepOutcomeKind.SUCCESS, output=outcome.output)
        ledger.transition("finish", RunStatus.FINISHED, kind="finished", step=step, actor=actor, reason=reason)
    elif outcome.kind == "reattempt":
        wait = coerce_duration(outcome.wait or 0, "reattempt(wait=)")
        ledger.move_step(step, "complete", outcome=StepOutcomeKind.REATTEMPTED, reattempt_reason="flow_control")
        _reattempt(ledger, step, definition, wait, actor=actor, reason=reason)
    elif outcome.kind == "skip":
        ledger.move_step(step, "skip", outcome=StepOutcomeKind.SKIPPED)
        continue_after(ledger, step, kind="step_skipped", actor=actor, reason=reason, details=outcome.details)
    elif outcome.kind == "pause":
        ledger.move_step(step, "cancel", outcome=StepOutcomeKind.PAUSED)
        _pause(ledger, step, "step_pause", kind="paused", actor=actor, reason=reason)
    elif outcome.kind == "cancel":
        ledger.move_step(step, "cancel", outcome=StepOutcomeKind.CANCELLED)
        why: dict[str, Any] = {"actor": actor, "reason": reason, "details": outcome.details}
        ledger.transition("cancel", RunStatus.CANCELLED, kind="cancelled", step=step, **why)
    elif outcome.kind == "error":
        _apply_error(ledger, step, definition, outcome)
    elif outcome.kind == "fan_out":
        _open_fan_out(ledger, step, definition, outcome)
    elif outcome.kind == "stall":  # the database went away under the body, or a coroutine's timeout= passed
        cause = f"{_class_name(outcome.error)}: {error_message(outcome.error)}" if outcome.error else None
        stall_step(ledger, step, detection=outcome.details.get("detection", "connection_lost"), cause=cause)
    else:
        raise ValueError(f"Unknown outcome kind {outcome.kind!r}")


def _open_fan_out(
    ledger: RunLedger, step: WorkflowStep, definition: StepDefinition | None, outcome: StepOutcome
) -> None:
    """Insert the jobs (or start the children) and park the step until the last one ends (none: done at once).

    The output the body kept (``output()``) is the step's; without one, its counts are.
    """
    jobs, children, kept = outcome.jobs, outcome.children, outcome.output
    if not jobs and not children:
        empty = {"total": 0, "succeeded": 0, "failed": 0}
        output = empty if kept is None else kept
        ledger.move_step(step, "complete", outcome=StepOutcomeKind.SUCCESS, output=output, fan_out_total=0)
        continue_after(ledger, step, kind="step_completed", details={"fan_out": empty})
        return
    if children:
        ended = open_children(ledger, step, children)
        ledger.move_step(
            step, "park", fan_out_total=len(children), waiting_since=ledger.now, stall_at=None, output=kept
        )
        details = {"children": len(children), "ended": ended}
        ledger.transition("park", RunStatus.WAITING, kind="fan_out_started", step=step, details=details)
        if ended == len(children):  # every child was re-attached already ended: resolve once this commits
            ledger.settle(step)
        return
    max_attempts = definition.max_attempts if definition is not None else 1
    FanOutJob.objects.bulk_create(
        [
            FanOutJob(
                step=step,
                run=ledger.run,
                index=index,
                function=path,
                arguments=arguments,
                max_attempts=max_attempts,
                queue=step.queue,
                priority=step.priority,
                scheduled_at=ledger.now,
            )
            for index, (path, arguments) in enumerate(jobs)
        ],
        batch_size=1000,
    )
    ledger.move_step(step, "park", fan_out_total=len(jobs), waiting_since=ledger.now, stall_at=None, output=kept)
    ledger.transition("park", RunStatus.WAITING, kind="fan_out_started", step=step, details={"jobs": len(jobs)})
    ledger.wake(step.queue)


def return_signal(ledger: RunLedger, step: WorkflowStep, why: str) -> None:
    """Put the signal that woke ``step`` back to pending: its body never ran, so nothing used it.

    Only a signal this very attempt consumed: a retry that inherited the signal of an attempt
    whose body ran (a ``wait_for`` step's reattempt) keeps it consumed.
    """
    signal_pk = step.signal_id
    if signal_pk is None:
        return
    source, target = SIGNAL_EVENTS["return"]
    returned = WorkflowSignal.objects.filter(pk=signal_pk, status=source, consumed_by_id=step.pk).update(
        status=target, consumed_by=None, consumed_at=None
    )
    if not returned:
        return
    step.signal = None
    rows.update(step, ["signal"])
    ledger.event("signal_returned", step=step, details={"signal_id": signal_pk, "why": why})


def continue_after(
    ledger: RunLedger,
    step: WorkflowStep,
    *,
    kind: str,
    actor: str | None = None,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
) -> WorkflowStep | None:
    """Schedule the step after ``step`` (or finish the run); a paused run stays paused."""
    following = ledger.cls.next_step_after(step.step_name)
    if following is None:
        ledger.transition(
            "finish",
            RunStatus.FINISHED,
            kind="finished",
            step=step,
            actor=actor,
            reason=reason,
            details={"last_step_outcome": step.outcome, **(details or {})},
        )
        return None
    next_step = ledger.schedule(following)
    _advance(
        ledger, step, kind=kind, actor=actor, reason=reason, details={"next_step": following.name, **(details or {})}
    )
    return next_step


def _advance(ledger: RunLedger, step: WorkflowStep, **kwargs: Any) -> None:
    ledger.transition("advance", RunStatus.READY, **kwargs, step=step)


def _reattempt(
    ledger: RunLedger,
    step: WorkflowStep,
    definition: StepDefinition | None,
    wait: timedelta,
    *,
    actor: str | None,
    reason: str | None,
    details: dict[str, Any] | None = None,
) -> None:
    if definition is None:  # an undefined step pauses (forced action); it never reattempts
        raise StepNotDefined(step.step_name)
    ledger.schedule(definition, wait=wait, attempt=step.attempt + 1, retry_of=step)
    _advance(
        ledger,
        step,
        kind="step_reattempted",
        actor=actor,
        reason=reason,
        details={"wait_seconds": wait.total_seconds(), "next_attempt": step.attempt + 1, **(details or {})},
    )


def _pause(ledger: RunLedger, step: WorkflowStep, transition: str, **kwargs: Any) -> None:
    ledger.transition(transition, RunStatus.PAUSED, step=step, **kwargs)
    ledger.set_run(paused_reason=kwargs.get("reason") or "")


def _earlier_attempts(step: WorkflowStep) -> Iterator[tuple[str, str]]:
    """``(outcome, reattempt_reason)`` of this step's earlier attempts in the run, the latest first."""
    return (
        WorkflowStep.objects.filter(run_id=step.run_id, step_name=step.step_name, pk__lt=step.pk)
        .order_by("-pk")
        .values_list("outcome", "reattempt_reason")
        .iterator()
    )


def consecutive_error_reattempts(step: WorkflowStep) -> int:
    """Error reattempts of this step since its last attempt that was not reattempted.

    Voluntary ``reattempt()`` calls are passed over: they neither count nor break the run.
    """
    count = 0
    for outcome, reason in _earlier_attempts(step):
        if outcome != StepOutcomeKind.REATTEMPTED:
            break
        count += reason in ERROR_REATTEMPT_REASONS
    return count


def consecutive_stalls(step: WorkflowStep) -> int:
    """Attempts of this step stalled and reattempted right before ``step``.

    A stall that paused the run ends the count: a run resumed by an operator starts afresh.
    """
    count = 0
    for outcome, reason in _earlier_attempts(step):
        if outcome != StepOutcomeKind.STALLED or reason != STALL_REATTEMPT:
            break
        count += 1
    return count


def _error_details(outcome: StepOutcome) -> dict[str, Any]:
    if outcome.error is None:
        return {}
    return {"error_class": _class_name(outcome.error), "error_message": error_message(outcome.error)[:2000]}


def _class_name(error: BaseException) -> str:
    klass = type(error)
    return klass.__qualname__ if klass.__module__ == "builtins" else f"{klass.__module__}.{klass.__qualname__}"


def _apply_error(
    ledger: RunLedger, step: WorkflowStep, definition: StepDefinition | None, outcome: StepOutcome
) -> None:
    error = outcome.error or RuntimeError("unknown error")
    error_fields = {
        "error_class": _class_name(error)[:255],
        "error_message": error_message(error),
        "traceback": outcome.traceback,
    }
    if outcome.forced_action:
        policy = OnException(action=outcome.forced_action)
    else:
        policy = resolve_policy(ledger.cls, definition, error)
    action = policy.action
    details = {**_error_details(outcome), **outcome.details}
    actor, reason = outcome.actor, outcome.reason
    if action == "reattempt":
        count = consecutive_error_reattempts(step)
        if policy.max_reattempts is not None and count >= policy.max_reattempts:
            action = policy.terminal_action
            details["reattempts_exhausted"] = count
        else:
            reattempt_reason = "precondition" if outcome.precondition else "exception_policy"
            fields = {"outcome": StepOutcomeKind.REATTEMPTED, "reattempt_reason": reattempt_reason, **error_fields}
            ledger.move_step(step, "fail", **fields)
            wait = resolve_wait(policy.wait, count + 1)
            outcome.reattempt = (count + 1, policy.max_reattempts, wait)
            _reattempt(ledger, step, definition, wait, actor=actor, reason=reason, details=details)
            return
    details["action"] = action
    if action == "skip":
        ledger.move_step(step, "skip", outcome=StepOutcomeKind.SKIPPED, **error_fields)
        continue_after(ledger, step, kind="step_skipped", actor=actor, reason=reason, details=details)
    elif action == "cancel":
        ledger.move_step(step, "fail", outcome=StepOutcomeKind.CANCELLED, **error_fields)
        ledger.transition(
            "cancel", RunStatus.CANCELLED, kind="step_failed", step=step, actor=actor, reason=reason, details=details
        )
    else:
        ledger.move_step(step, "fail", outcome=StepOutcomeKind.FAILED, **error_fields)
        message = f"{error_fields['error_class']}: {error_fields['error_message']}"
        _pause(ledger, step, "hold", kind="step_failed", actor=actor, reason=reason or message[:2000], details=details)


def stall_step(ledger: RunLedger, step: WorkflowStep, *, detection: str, cause: str | None = None) -> None:
    """Apply ``STALL_ACTION`` to an in-progress attempt that outlived its ``stall_at`` or its dispatcher.

    The attempt fails with :class:`StepStalled` recorded (outcome ``stalled``, which ends
    a run of error reattempts); ``reattempt`` schedules the step again now, ``pause`` and
    ``cancel`` stop the run. A body still running somewhere has its late outcome discarded.
    A step stalled again after ``MAX_STALLS`` stalled attempts in a row (one that crashes
    its dispatcher every time) pauses the run instead of looping.
    """
    action = settings.STALL_ACTION
    since = step.started_at.isoformat() if step.started_at else "?"
    error = StepStalled(
        f"Step {step.step_name} attempt {step.attempt} (claimed by {step.claimed_by or '?'} at {since}) "
        f"stalled: {detection}"
    )
    reason = str(error)
    details: dict[str, Any] = {"detection": detection, "action": action, "claimed_by": step.claimed_by}
    if cause:
        details["cause"] = cause[:2000]
    definition = ledger.cls.step_definition(step.step_name)
    if action == "reattempt" and definition is None:
        action = details["action"] = "pause"
    streak = consecutive_stalls(step)
    limit = settings.MAX_STALLS
    if action == "reattempt" and limit is not None and streak >= limit:
        action = details["action"] = "pause"
        details["stalls_exhausted"] = streak
        reason = f"{error} ({streak + 1} stalled attempts in a row)"
    ledger.move_step(
        step,
        "fail",
        outcome=StepOutcomeKind.STALLED,
        reattempt_reason=STALL_REATTEMPT if action == "reattempt" else "",
        error_class=_class_name(error),
        error_message=str(error),
    )
    if action == "reattempt" and definition is not None:
        ledger.schedule(definition, wait=timedelta(0), attempt=step.attempt + 1, retry_of=step)
        _advance(ledger, step, kind="step_stalled", details=details)
        return
    if action == "cancel":
        ledger.transition("cancel", RunStatus.CANCELLED, kind="step_stalled", step=step, details=details)
    else:
        _pause(ledger, step, "hold", kind="step_stalled", reason=reason, details=details)
