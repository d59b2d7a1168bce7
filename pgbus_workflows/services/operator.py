"""The operator verbs: pause, resume, resume_at, cancel, rerun, run_now, skip.

Each locks the run, asks :func:`states.allowed_verbs` whether the run's state admits the
verb (the same answer the admin's buttons and the CLI show), moves it through the transition
table, writes an event with its ``actor`` and ``reason``, and returns the run row as it now
is. The handle, the admin and the test helpers all call these.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..dsl.declared import registry
from ..exceptions import InvalidTransition, NotPaused, StepNotDefined
from ..models import WorkflowRun, WorkflowStep
from ..states import TERMINAL_RUN, RunFacts, RunStatus, StepOutcomeKind, StepStatus, allowed_verbs
from . import fanout, slots, waiting
from .ledger import RunLedger
from .locks import locked_run
from .outcome import StepOutcome, continue_after, return_signal
from .payload import load_subject
from .resolution import resolve_in_ledger
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
        _admit(ledger, "pause")
        ledger.transition("pause", RunStatus.PAUSED, kind="paused", actor=actor or DEFAULT_ACTOR, reason=reason)
        ledger.set_run(paused_reason=reason or "")
    return ledger.run


def resume(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Resume a paused run: its scheduled step keeps its time; a failed or paused step runs again now."""
    with locked_run(pk) as ledger:
        active = _admit(ledger, "resume")
        if active is None:
            definition = ledger.cls.step_definition(ledger.run.current_step)
            if definition is None:  # never admitted without one (states.RunFacts.current_step_known)
                raise StepNotDefined(f"Cannot resume {ledger.run.workflow_id}: its step is not defined")
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
            resolve_in_ledger(ledger, active)  # its jobs may all have ended while it was paused
    return ledger.run


def resume_at(pk: int, step_name: str, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Resume a paused run at ``step_name``, due now; its active attempt (if any) is cancelled."""
    with locked_run(pk) as ledger:
        active = _admit(ledger, "resume_at")
        definition, superseded = ledger.cls.rewind_to(ledger.run, step_name)
        if active is not None:
            _return_unused_signal(ledger, active, "resume_at")
            slots.cancel_attempt(ledger, active, StepOutcomeKind.CANCELLED)
            _abandon_fan_out(ledger, active, f"its parent was resumed at {step_name}")
        step = ledger.schedule(definition, wait=timedelta(0))
        ledger.transition(
            "resume",
            RunStatus.READY,
            kind="resumed_at",
            actor=actor or DEFAULT_ACTOR,
            reason=reason,
            step=step,
            details={"step": step_name, **({"superseded": superseded} if superseded else {})},
        )
    return ledger.run


def cancel(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Cancel an ongoing run; its active attempt is cancelled (a running body's outcome is discarded).

    A running body keeps its concurrency slots until it returns or is stalled (``services.slots``).
    """
    with locked_run(pk) as ledger:
        active = _admit(ledger, "cancel")
        if active is not None:
            slots.cancel_attempt(ledger, active, StepOutcomeKind.CANCELLED)
            _abandon_fan_out(ledger, active, "its parent was cancelled" + (f": {reason}" if reason else ""))
        ledger.transition(
            "cancel", RunStatus.CANCELLED, kind="cancelled", actor=actor or DEFAULT_ACTOR, reason=reason, step=active
        )
    return ledger.run


def rerun(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Start a new run with a finished or cancelled run's class, subject and arguments."""
    with locked_run(pk) as ledger:
        _admit(ledger, "rerun")
        old = ledger.run
        subject = load_subject(old.subject_type, old.subject_id)
        if old.subject_type and subject is None:
            raise InvalidTransition(f"Cannot rerun: its subject {old.subject_type} {old.subject_id} no longer exists")
        who = actor or DEFAULT_ACTOR
        handle = start_run(ledger.cls, subject, arguments=old.arguments, actor=who, reason=reason, rerun_of=old)
        ledger.event(
            "rerun", actor=actor or DEFAULT_ACTOR, reason=reason, details={"new_workflow_id": str(handle.workflow_id)}
        )
    return handle.record


def run_now(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Make the run's scheduled step due now (its ``wait`` is cut short)."""
    with locked_run(pk) as ledger:
        active = _admit(ledger, "run_now")
        if active is None:  # never admitted without one: a scheduled attempt due later, or one waiting
            raise InvalidTransition(f"Cannot run_now a {ledger.run.status} workflow: no scheduled step")
        if active.status == StepStatus.WAITING:
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
        active = _admit(ledger, "skip")
        if run.status == RunStatus.WAITING and active is not None:
            _abandon_fan_out(ledger, active, f"its parent skipped {active.step_name}")
            waiting.resolve(ledger, active, StepOutcome("skip", actor=actor, reason=reason))
            return ledger.run
        current = active or _last_attempt(ledger)
        if current is None:
            raise InvalidTransition(f"Cannot skip on workflow {run.workflow_id}: it has no step")
        if run.status == RunStatus.PAUSED:
            ledger.transition("resume", RunStatus.READY, kind="resumed", actor=actor, reason=reason, step=active)
        if active is not None:
            _return_unused_signal(ledger, active, "skip")
            ledger.move_step(active, "skip", outcome=StepOutcomeKind.SKIPPED)
            _abandon_fan_out(ledger, active, f"its parent skipped {active.step_name}")
        continue_after(
            ledger, current, kind="step_skipped", actor=actor, reason=reason, details={"skipped": current.step_name}
        )
    return ledger.run


def _abandon_fan_out(ledger: RunLedger, step: WorkflowStep, why: str) -> None:
    """The run stops waiting for ``step``'s members: its pending jobs and its children (``parent_close="cancel"``) end.

    Each child is cancelled under its own lock, taken after its parent's (the one order locks
    are ever taken in between runs), in this same transaction: grandchildren follow, and no
    child outlives a cancel that committed.
    """
    fanout.cancel_pending_jobs(step)
    if step.fan_out_total is None:
        return
    children = (
        WorkflowRun.objects.ongoing()
        .filter(parent_id=ledger.run.pk, parent_close="cancel")
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    for child_pk in list(children):
        try:
            cancel(child_pk, actor=f"parent:{ledger.run.workflow_id}", reason=why)
        except InvalidTransition:  # it ended meanwhile: nothing to cancel
            continue


def _return_unused_signal(ledger: RunLedger, step: WorkflowStep, why: str) -> None:
    """A scheduled attempt a signal woke ends unrun: the signal waits for the step that will run."""
    if step.status == StepStatus.SCHEDULED and step.signal_id is not None:
        return_signal(ledger, step, why)


def run_facts(run: WorkflowRun, active: WorkflowStep | None, now: datetime) -> RunFacts:
    """What :func:`states.allowed_verbs` needs to know about ``run`` and its active attempt."""
    klass = registry.get(run.workflow_class)
    return RunFacts(
        status=run.status,
        active_status=active.status if active is not None else None,
        active_due_later=active is not None and active.scheduled_at > now,
        active_waits_for_signal=active is not None and bool(active.wait_for),
        class_known=klass is not None,
        current_step_known=klass is not None and klass.step_definition(run.current_step) is not None,
        class_has_steps=klass is not None and bool(klass.step_definitions()),
        takes_signals=klass is None or bool(klass.signal_names()),
    )


def _admit(ledger: RunLedger, verb: str) -> WorkflowStep | None:
    """The run's active attempt (locked), if its state admits ``verb``; else the verb's refusal."""
    active = ledger.active_step()
    facts = run_facts(ledger.run, active, ledger.now)
    if verb not in allowed_verbs(facts):
        raise _refusal(ledger, verb, facts, active)
    return active


def _refusal(ledger: RunLedger, verb: str, facts: RunFacts, active: WorkflowStep | None) -> Exception:
    """Why the run's state refuses ``verb``, in the words of the exception the caller catches."""
    run, status = ledger.run, facts.status
    missing = f"its step {run.current_step!r} is not defined in {run.workflow_class}"
    if not facts.class_known:
        missing += " (the class is not registered)"
    if verb in ("resume", "resume_at"):
        if status != RunStatus.PAUSED:
            return NotPaused(f"Cannot {verb} a {status} workflow: it is not paused")
        if verb == "resume":
            return StepNotDefined(f"Cannot resume {run.workflow_id}: {missing}; resume_at() another step or cancel it")
        return StepNotDefined(
            f"Cannot resume_at on {run.workflow_id}: {run.workflow_class} has no steps. Available steps: none"
        )
    if verb == "rerun":
        if status not in TERMINAL_RUN:
            hint = "resume it" if status == RunStatus.PAUSED else "cancel it first"
            return InvalidTransition(
                f"Cannot rerun a {status} workflow: only finished or cancelled runs rerun ({hint})"
            )
        return InvalidTransition(f"Cannot rerun: workflow class {run.workflow_class!r} is not registered")
    if verb == "run_now" and status not in TERMINAL_RUN:
        if active is not None and active.status == StepStatus.SCHEDULED and not facts.active_due_later:
            return InvalidTransition(f"Cannot run_now: step {active.step_name} is already due")
        state = "no scheduled step" if active is None else f"its step {active.step_name} is {active.status}"
        return InvalidTransition(f"Cannot run_now a {status} workflow: {state}")
    if verb == "skip" and status in (RunStatus.READY, RunStatus.PAUSED, RunStatus.WAITING):
        if active is not None and active.status not in (StepStatus.SCHEDULED, StepStatus.WAITING):
            return InvalidTransition(f"Cannot skip on a {status} workflow: its step is {active.status}")
        if _last_attempt(ledger) is None:
            return InvalidTransition(f"Cannot skip on workflow {run.workflow_id}: it has no step")
        return StepNotDefined(
            f"Cannot skip {run.workflow_id}: {missing}, so there is no next step to go to; "
            "resume_at() another step or cancel it"
        )
    why = ": its step is running" if verb == "skip" and status == RunStatus.PERFORMING else ""
    return InvalidTransition(f"Cannot {'skip on' if verb == 'skip' else verb} a {status} workflow{why}")


def _last_attempt(ledger: RunLedger) -> WorkflowStep | None:
    return WorkflowStep.objects.filter(run_id=ledger.run.pk).order_by("-pk").first()
