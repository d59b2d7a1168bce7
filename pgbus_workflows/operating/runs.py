"""What ``manage.py workflows`` reads: runs found by id, the filtered list, a run's details.

Every query is served by an index, whatever the size of the runs table: a workflow id (or
the start of one) by the unique index on ``workflow_id``, a subject by ``pgbus_wf_run_subject``,
a class or status by ``pgbus_wf_run_class_status``, a stuck reason by the steps' partial
indexes (the queries the admin's filter and the sweep's gauge use), and the list is the newest
``limit`` runs (walking the primary key backwards, stopping at ``limit``): nothing counts
the runs table. The rows come back as plain dicts, ready for JSON or for a table.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery

from ..models import WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from ..services.resolution import progress
from ..services.stuck import STUCK_REASONS, stuck_querysets
from ..sql import clock
from ..sql.counting import distinct_values
from ..states import SignalStatus

#: The shortest start of a workflow id that finds a run (the 8 characters the admin's list shows).
MIN_PREFIX = 8


class RunNotFound(LookupError):
    """A workflow id (or the start of one) that names no run, or more than one."""


def with_latest_attempt(runs: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
    """``runs`` annotated with the number of their latest attempt (one subquery, as the admin's list)."""
    if "latest_attempt" in runs.query.annotations:  # the admin's queryset already has it
        return runs
    latest = WorkflowStep.objects.filter(run_id=OuterRef("pk")).order_by("-pk").values("attempt")[:1]
    return runs.annotate(latest_attempt=Subquery(latest))


def find_run(runs: QuerySet[WorkflowRun], text: str) -> WorkflowRun:
    """The run of ``runs`` whose workflow id is ``text``, or starts with it (8 hex digits or more).

    A start of an id is looked up as the range of ids it begins, so the unique index serves it.
    Raises :class:`RunNotFound` for no run, several runs, or text that is no workflow id.
    """
    digits = text.strip().lower().replace("-", "")
    if len(digits) < MIN_PREFIX or len(digits) > 32 or any(c not in "0123456789abcdef" for c in digits):
        raise RunNotFound(f"{text!r} is not a workflow id (its 32 hex digits, or the first {MIN_PREFIX} or more)")
    if len(digits) == 32:
        matches = list(runs.filter(workflow_id=uuid.UUID(digits))[:1])
    else:
        low, high = uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))
        matches = list(runs.filter(workflow_id__range=(low, high)).order_by("workflow_id")[:2])
    if not matches:
        raise RunNotFound(f"No workflow run {text}")
    if len(matches) > 1:
        raise RunNotFound(f"Several workflow runs start with {text}: give more of the id")
    return matches[0]


def stored_classes() -> list[str]:
    """Every workflow class that has runs, one index probe per class (a loose scan of the class index)."""
    return distinct_values(WorkflowRun, "workflow_class")


@dataclass(frozen=True)
class Subject:
    """A subject as runs store it: ``app_label.model`` and, optionally, its primary key as text."""

    type: str
    id: str | None = None

    @classmethod
    def parse(cls, text: str) -> Subject:
        """``"shop.order:42"`` (one subject) or ``"shop.order"`` (every subject of that model)."""
        label, colon, pk = text.partition(":")
        app_label, _dot, model = label.strip().partition(".")
        if not app_label or not model or "." in model or (colon and not pk):
            raise ValueError(f"a subject is app_label.model:pk (shop.order:42) or app_label.model, got {text!r}")
        return cls(f"{app_label}.{model}".lower(), pk if colon else None)


def list_runs(
    runs: QuerySet[WorkflowRun],
    *,
    classes: Sequence[str] = (),
    statuses: Sequence[str] = (),
    stuck: str | None = None,
    subject: Subject | None = None,
    limit: int = 50,
) -> tuple[list[WorkflowRun], bool]:
    """The newest ``limit`` runs of ``runs`` that match every filter given, and whether more match.

    Newest by id; of one class, newest by start.
    """
    narrowed = list(classes) or (stored_classes() if statuses or stuck else None)
    if narrowed is not None:
        # Without --class, every stored class: that keeps every row, but lets the planner reach a
        # rare status through the (class, status) index instead of reading every run (status
        # alone has no index).
        runs = runs.filter(workflow_class__in=narrowed)
    if statuses:
        runs = runs.filter(status__in=statuses)
    if subject is not None:
        runs = runs.filter(subject_type=subject.type)
        if subject.id is not None:
            runs = runs.filter(subject_id=subject.id)
    if stuck is not None:
        if stuck not in STUCK_REASONS:
            raise ValueError(f"Unknown stuck reason {stuck!r}: one of {', '.join(STUCK_REASONS)}")
        stuck_runs = stuck_querysets(clock.now())[stuck].filter(workflow_class__in=narrowed)
        runs = runs.filter(pk__in=stuck_runs.values("pk"))
    # One class's newest by start, as the admin's list (``pgbus_wf_run_class_started``): by id, it
    # would walk the primary key past every newer run of the other classes.
    newest = ("-started_at", "-pk") if len(classes) == 1 else ("-pk",)
    rows = list(with_latest_attempt(runs).order_by(*newest)[: limit + 1])
    return rows[:limit], len(rows) > limit


def run_row(run: WorkflowRun) -> dict[str, Any]:
    """A run as the list shows it (and as ``show`` starts)."""
    return {
        "workflow_id": str(run.workflow_id),
        "workflow_class": run.workflow_class,
        "status": run.status,
        "current_step": run.current_step,
        "attempt": getattr(run, "latest_attempt", None),
        "subject": subject_label(run),
        "created_at": run.created_at,
        "status_changed_at": run.status_changed_at,
    }


def subject_label(run: WorkflowRun) -> str | None:
    """``"shop.order:42"``: the form ``--subject`` takes."""
    if not run.subject_type:
        return None
    return f"{run.subject_type}:{run.subject_id}"


def run_details(run: WorkflowRun) -> dict[str, Any]:
    """Every field of the run a terminal shows."""
    return {
        **run_row(run),
        "arguments": run.arguments,
        "idempotency_key": run.idempotency_key,
        "debounce_key": run.debounce_key,
        "allow_multiple": run.allow_multiple,
        "paused_reason": run.paused_reason,
        "rerun_of": str(run.rerun_of) if run.rerun_of else None,
        **dict(zip(("started_by", "start_reason"), run.start_audit() or (None, None), strict=True)),
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "parent": str(run.parent.workflow_id) if run.parent_id is not None and run.parent is not None else None,
        "children": children_by_status(run),
    }


def children_by_status(run: WorkflowRun) -> dict[str, int] | None:
    """``{status: count}`` of the runs this run's fan-outs started (None: it started none); read by index."""
    return WorkflowRun.objects.filter(parent_id=run.pk).count_by_status() or None


def latest(rows: QuerySet[Any], limit: int) -> tuple[list[Any], bool]:
    """The last ``limit`` rows (by key), oldest first, and whether older ones were left out."""
    found = list(rows.order_by("-pk")[: limit + 1])
    return found[:limit][::-1], len(found) > limit


def attempt_row(step: WorkflowStep) -> dict[str, Any]:
    """One attempt of a step, with its error and, for a fan-out, its jobs' progress."""
    return {
        "step_name": step.step_name,
        "attempt": step.attempt,
        "status": step.status,
        "outcome": step.outcome,
        "queue": step.queue,
        "scheduled_at": step.scheduled_at,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "claimed_by": step.claimed_by,
        "wait_for": step.wait_for,
        "timeout_at": step.timeout_at,
        "output": step.output,
        "error_class": step.error_class,
        "error_message": step.error_message,
        "fan_out": progress(step) if step.fan_out_total is not None else None,
    }


def event_row(event: WorkflowEvent) -> dict[str, Any]:
    """One line of the audit trail."""
    return {
        "created_at": event.created_at,
        "kind": event.kind,
        "from_status": event.from_status,
        "to_status": event.to_status,
        "actor": event.actor,
        "reason": event.reason,
        "details": event.details,
    }


def signal_row(signal: WorkflowSignal) -> dict[str, Any]:
    """A signal delivered to the run."""
    return {
        "id": signal.pk,
        "name": signal.name,
        "status": signal.status,
        "payload": signal.payload,
        "idempotency_key": signal.idempotency_key,
        "actor": signal.actor,
        "received_at": signal.received_at,
    }


def pending_signals(run: WorkflowRun, limit: int) -> tuple[list[WorkflowSignal], bool]:
    """The run's pending signals, oldest first (the order steps consume them), at most ``limit``."""
    found = list(WorkflowSignal.objects.filter(run_id=run.pk, status=SignalStatus.PENDING).order_by("pk")[: limit + 1])
    return found[:limit], len(found) > limit


def active_attempt(run: WorkflowRun) -> WorkflowStep | None:
    """The run's scheduled, in-progress or waiting attempt, if any."""
    return WorkflowStep.objects.filter(run_id=run.pk).active().order_by("-pk").first()
