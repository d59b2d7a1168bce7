"""Forking a run: a new run of its class, subject and arguments that keeps its earlier steps' outputs.

The fork's steps before ``from_step`` are copies of the original's latest successful attempts
(completed rows whose ``claimed_by`` names the original, each with a ``step_copied`` event
that links it), so they are not run again and later steps read their outputs as they would
read their own run's. The fork starts at ``from_step``, due now. Both runs get an audit
event. Everything is one transaction under the original's run lock: the fork is a new row
no other transaction can see yet, so the only lock it waits for is the original's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.db.models import Q

from ..dsl.declared import registry
from ..dsl.definitions import StepDefinition
from ..exceptions import AlreadyRunning, InvalidTransition
from ..models import FanOutJob, WorkflowRun, WorkflowStep
from ..sql import rows
from ..states import ONGOING_RUN, RunStatus, StepOutcomeKind, StepStatus
from .ledger import RunLedger
from .locks import locked_run
from .operator import DEFAULT_ACTOR
from .payload import load_subject
from .start import new_run

if TYPE_CHECKING:
    from .handle import RunHandle

#: ``claimed_by`` of a copied attempt: the original run's id follows.
COPIED_FROM = "copied from "


def fork(pk: int, from_step: str | None = None, *, actor: str | None = None, reason: str | None = None) -> WorkflowRun:
    """Start a fork of run ``pk`` at ``from_step`` (the first step when None); returns the fork's row.

    Raises :class:`InvalidTransition` when the run's class is not deployed here or its subject
    is gone, :class:`StepNotDefined` when the class has no step ``from_step``, and
    :class:`AlreadyRunning` when the class does not allow multiple runs per subject and one
    (the original, or another) is ongoing.
    """
    actor = actor or DEFAULT_ACTOR
    with locked_run(pk) as ledger:
        original = ledger.run
        if registry.get(original.workflow_class) is None:
            raise InvalidTransition(
                f"Cannot fork {original.workflow_id}: workflow class {original.workflow_class!r} is not registered "
                "(not deployed in this code)"
            )
        cls = ledger.cls  # registered: the class itself, not the bare Workflow a gone class loads as
        start, earlier = cls.fork_point(original, from_step)
        subject = load_subject(original.subject_type, original.subject_id)
        if original.subject_type and subject is None:
            raise InvalidTransition(
                f"Cannot fork: its subject {original.subject_type} {original.subject_id} no longer exists"
            )
        before = set(earlier)
        record = _insert_fork(cls, original, start, ledger)
        fork_ledger = RunLedger(record, ledger.now)
        link = {"forked_from": str(original.workflow_id), "from_step": start.name}
        fork_ledger.event(
            "started",
            actor=actor,
            reason=reason,
            details={"arguments": record.arguments, **link},
            transition=("", "", RunStatus.READY),
        )
        copied = _copy_steps(cls, original, record, before, (fork_ledger, actor))
        fork_ledger.event("forked_from", actor=actor, reason=reason, details={**link, "copied_steps": copied})
        fork_ledger.schedule(start, attempt=1, wait=timedelta(0))
        fork_ledger.flush()
        ledger.event(
            "forked",
            actor=actor,
            reason=reason,
            details={"fork_workflow_id": str(record.workflow_id), "from_step": start.name, "copied_steps": copied},
        )
    return record


def _insert_fork(cls: type[RunHandle], original: WorkflowRun, start: StepDefinition, ledger: RunLedger) -> WorkflowRun:
    """The fork's run row, inserted; :class:`AlreadyRunning` when the subject's one ongoing run is taken."""
    record = new_run(cls, start, ledger.now, original.subject_type, original.subject_id, None, original.arguments)
    record.forked_from = original.workflow_id
    try:
        with transaction.atomic():
            rows.insert(record)
    except IntegrityError:
        holder = (
            WorkflowRun.objects.filter(workflow_class=cls.name, status__in=ONGOING_RUN)
            .for_subject(original.subject_type, original.subject_id)
            .first()
        )
        which = "the original" if holder is None or holder.pk == original.pk else f"run {holder.workflow_id}"
        raise AlreadyRunning(
            f"Cannot fork {original.workflow_id}: {cls.name} allows one ongoing run per subject and {which} "
            f"is {holder.status if holder else 'ongoing'}; cancel it first",
            workflow=holder,
        ) from None
    return record


def _copy_steps(
    cls: type[RunHandle], original: WorkflowRun, record: WorkflowRun, before: set[str], audit: tuple[RunLedger, str]
) -> list[str]:
    """Copy the original's latest successful attempt of each step in ``before``; returns their names in order.

    ``audit``: the fork's ledger, which records a ``step_copied`` event per copy, and the actor.
    """
    ledger, actor = audit
    latest: dict[str, WorkflowStep] = {}
    recorded = Q(outcome=StepOutcomeKind.SUCCESS)
    if cls.copied_failure is not None:  # a durable function's checkpoint that raised into it: recorded too
        recorded |= Q(status=StepStatus.FAILED, output=cls.copied_failure)
    for step in WorkflowStep.objects.filter(recorded, run_id=original.pk).order_by("pk"):
        definition = cls.step_definition(step.step_name)  # an attempt under a name its step was renamed from
        name = definition.name if definition is not None else step.step_name
        if name in before:
            latest[name] = step
    names = []
    for name, step in sorted(latest.items(), key=lambda item: item[1].pk):
        copy = rows.clone(
            step,
            id=None,
            run_id=record.pk,
            created_at=ledger.now,
            step_name=name,
            attempt=1,
            status=StepStatus.COMPLETED if step.outcome == StepOutcomeKind.SUCCESS else step.status,
            claimed_by=f"{COPIED_FROM}{original.workflow_id}",
            signal_id=None,  # the signal was consumed by the original's step: not delivered again
            limiters=None,
            holds_slots=False,
            parked=False,
            parked_on="",
            held=False,
        )
        rows.insert(copy)
        if step.fan_out_total is not None:
            _copy_jobs(step, copy)
        details = {"forked_from": str(original.workflow_id), "original_step_id": step.pk}
        ledger.event("step_copied", actor=actor, step=copy, details=details)
        names.append(name)
    return names


def _copy_jobs(step: WorkflowStep, copy: WorkflowStep) -> None:
    """A fan-out's jobs, with their results, under the copied step (children are not started again)."""
    jobs = [
        rows.clone(job, id=None, run_id=copy.run_id, step_id=copy.pk)
        for job in FanOutJob.objects.filter(step_id=step.pk)
    ]
    for job in jobs:
        rows.insert(job)
