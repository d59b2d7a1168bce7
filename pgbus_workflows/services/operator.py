"""The operator verbs: pause, resume, resume_at, cancel, rerun, run_now, skip.

Each locks the run, checks the move against the transition table, writes an event with
its ``actor`` and ``reason``, and returns the run row as it now is. The handle, the admin
and the test helpers all call these.
"""

from __future__ import annotations

from datetime import timedelta

from ..exceptions import InvalidTransition, NotPaused, StepNotDefined
from ..models import WorkflowRun, WorkflowStep
from ..registry import registry
from ..states import TERMINAL_RUN, RunStatus, StepOutcomeKind, StepStatus
from . import fanout, waiting
from .ledger import RunLedger, locked_run
from .outcome import StepOutcome, continue_after, return_signal
from .payload import load_subject
from .start import start_run

DEFAULT_ACTOR = "api"

#: The status a resumed run takes from its active attempt.
_RESUMED_STATUS = {
    StepStatus.SCHEDULED: RunStatus.READY,
    StepStatus.WAITING: RunStatus.WAITING,
    StepStatus.IN_PROGRESS: RunStatus.PERFORMING,
}


def pause(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Pause a ready, waiting or performing run; a running step finishes, nothing new starts."""
    with locked_run(pk) as ledger:
        ledger.transition("pause", RunStatus.PAUSED, kind="paused", actor=actor or DEFAULT_ACTOR, reason=reason)
        ledger.set_run(paused_reason=reason or "")
    return ledger.run


def resume(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Resume a paused run: its scheduled step keeps its time; a failed or paused step runs again now."""
    with locked_run(pk) as ledger:
        _require_paused(ledger, "resume")
        active = ledger.active_step()
        if active is None:
            definition = ledger.cls.step_definition(ledger.run.current_step)
            if definition is None:
                raise StepNotDefined(
                    f"Cannot resume {ledger.run.workflow_id}: its step {ledger.run.current_step!r} is not defined in "
                    f"{ledger.run.workflow_class}; resume_at() another step or cancel it"
                )
            active = ledger.schedule(definition, wait=timedelta(0), retry_of=_last_attempt(ledger))
        elif active.status == StepStatus.SCHEDULED:
            ledger.wake(active.queue)
        ledger.transition(
            "resume",
            _RESUMED_STATUS[StepStatus(active.status)],
            kind="resumed",
            actor=actor or DEFAULT_ACTOR,
            reason=reason,
            step=active,
        )
        if active.status == StepStatus.WAITING and active.fan_out_total is not None:
            fanout.resolve_in_ledger(ledger, active)  # its jobs may all have ended while it was paused
    return ledger.run


def resume_at(pk: int, step_name: str, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Resume a paused run at ``step_name``, due now; its active attempt (if any) is cancelled."""
    with locked_run(pk) as ledger:
        _require_paused(ledger, "resume_at")
        definition = ledger.cls.require_step(step_name)
        active = ledger.active_step()
        if active is not None:
            _return_unused_signal(ledger, active, "resume_at")
            ledger.move_step(active, "cancel", outcome=StepOutcomeKind.CANCELLED)
            fanout.cancel_pending_jobs(active)
        step = ledger.schedule(definition, wait=timedelta(0))
        ledger.transition(
            "resume",
            RunStatus.READY,
            kind="resumed_at",
            actor=actor or DEFAULT_ACTOR,
            reason=reason,
            step=step,
            details={"step": step_name},
        )
    return ledger.run


def cancel(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Cancel an ongoing run; its active attempt is cancelled (a running body's outcome is discarded)."""
    with locked_run(pk) as ledger:
        if ledger.run.status in TERMINAL_RUN:
            raise InvalidTransition(f"Cannot cancel a {ledger.run.status} workflow")
        active = ledger.active_step()
        if active is not None:
            ledger.move_step(active, "cancel", outcome=StepOutcomeKind.CANCELLED)
            fanout.cancel_pending_jobs(active)
        ledger.transition(
            "cancel", RunStatus.CANCELLED, kind="cancelled", actor=actor or DEFAULT_ACTOR, reason=reason, step=active
        )
    return ledger.run


def rerun(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Start a new run with a finished or cancelled run's class, subject and arguments."""

    with locked_run(pk) as ledger:
        old = ledger.run
        if old.status not in TERMINAL_RUN:
            hint = "resume it" if old.status == RunStatus.PAUSED else "cancel it first"
            raise InvalidTransition(
                f"Cannot rerun a {old.status} workflow: only finished or cancelled runs rerun ({hint})"
            )
        if registry.get(old.workflow_class) is None:
            raise InvalidTransition(f"Cannot rerun: workflow class {old.workflow_class!r} is not registered")
        subject = load_subject(old.subject_type, old.subject_id)
        if old.subject_type and subject is None:
            raise InvalidTransition(f"Cannot rerun: its subject {old.subject_type} {old.subject_id} no longer exists")
        handle = start_run(ledger.cls, subject, arguments=old.arguments, actor=actor or DEFAULT_ACTOR, rerun_of=old)
        ledger.event(
            "rerun", actor=actor or DEFAULT_ACTOR, reason=reason, details={"new_workflow_id": str(handle.workflow_id)}
        )
    return handle.record


def run_now(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Make the run's scheduled step due now (its ``wait`` is cut short)."""
    with locked_run(pk) as ledger:
        if ledger.run.status in TERMINAL_RUN:
            raise InvalidTransition(f"Cannot run_now a {ledger.run.status} workflow")
        active = ledger.active_step()
        if active is not None and active.status == StepStatus.WAITING and active.wait_for:
            # A wait_for step runs now as if its wait_timeout had passed with on_timeout="run".
            ledger.event(
                "run_now",
                actor=actor or DEFAULT_ACTOR,
                reason=reason,
                step=active,
                details={"was_waiting_for": active.wait_for},
            )
            waiting.wake(
                ledger,
                active,
                kind="step_woken",
                actor=actor or DEFAULT_ACTOR,
                reason=reason,
                details={"run_now": True},
                timed_out=True,
            )
            return ledger.run
        if active is None or active.status != StepStatus.SCHEDULED:
            state = "no scheduled step" if active is None else f"its step {active.step_name} is {active.status}"
            raise InvalidTransition(f"Cannot run_now a {ledger.run.status} workflow: {state}")
        if active.scheduled_at <= ledger.now:
            raise InvalidTransition(f"Cannot run_now: step {active.step_name} is already due")
        ledger.event(
            "run_now",
            actor=actor or DEFAULT_ACTOR,
            reason=reason,
            step=active,
            details={"was_scheduled_at": active.scheduled_at.isoformat()},
        )
        active.scheduled_at = ledger.now
        active.save(update_fields=["scheduled_at"])
        ledger.wake(active.queue)
    return ledger.run


def skip(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Skip the current step of a ready, waiting or paused run and move on (a paused run resumes)."""
    with locked_run(pk) as ledger:
        run = ledger.run
        actor = actor or DEFAULT_ACTOR
        if run.status not in (RunStatus.READY, RunStatus.PAUSED, RunStatus.WAITING):
            why = ": its step is running" if run.status == RunStatus.PERFORMING else ""
            raise InvalidTransition(f"Cannot skip on a {run.status} workflow{why}")
        active = ledger.active_step()
        if active is not None and active.status not in (StepStatus.SCHEDULED, StepStatus.WAITING):
            raise InvalidTransition(f"Cannot skip on a {run.status} workflow: its step is {active.status}")
        if run.status == RunStatus.WAITING and active is not None:
            fanout.cancel_pending_jobs(active)
            waiting.resolve(ledger, active, StepOutcome("skip", actor=actor, reason=reason))
            return ledger.run
        current = active or _last_attempt(ledger)
        if current is None:
            raise InvalidTransition(f"Cannot skip on workflow {run.workflow_id}: it has no step")
        if ledger.cls.step_definition(current.step_name) is None:
            raise StepNotDefined(
                f"Cannot skip {run.workflow_id}: its step {current.step_name!r} is not defined in "
                f"{run.workflow_class}, so there is no next step to go to; resume_at() another step or cancel it"
            )
        if run.status == RunStatus.PAUSED:
            ledger.transition("resume", RunStatus.READY, kind="resumed", actor=actor, reason=reason, step=active)
        if active is not None:
            _return_unused_signal(ledger, active, "skip")
            ledger.move_step(active, "skip", outcome=StepOutcomeKind.SKIPPED)
            fanout.cancel_pending_jobs(active)
        continue_after(
            ledger, current, kind="step_skipped", actor=actor, reason=reason, details={"skipped": current.step_name}
        )
    return ledger.run


def _return_unused_signal(ledger: RunLedger, step: WorkflowStep, why: str) -> None:
    """A scheduled attempt a signal woke ends unrun: the signal waits for the step that will run."""
    if step.status == StepStatus.SCHEDULED and step.signal_id is not None:
        return_signal(ledger, step, why)


def _require_paused(ledger: RunLedger, verb: str) -> None:
    if ledger.run.status != RunStatus.PAUSED:
        raise NotPaused(f"Cannot {verb} a {ledger.run.status} workflow: it is not paused")


def _last_attempt(ledger: RunLedger) -> WorkflowStep | None:
    return WorkflowStep.objects.filter(run_id=ledger.run.pk).order_by("-pk").first()
