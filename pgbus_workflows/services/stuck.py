"""The stuck/gauge read model: runs by class and status, and by class and stuck reason.

The sweep sends it as the ``workflow_gauge`` signal; the admin's dashboard and stuck filter,
the CLI and the Prometheus collector read it too. It lives in the services, not in the sweep,
so those readers depend on the engine's read model and never on the dispatcher's process.
Every count is read through indexes only: a count above ``GAUGE_EXACT_UP_TO`` is the
planner's estimate, so its cost does not grow with the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, Subquery

from .. import sql
from ..conf import settings
from ..dsl.declared import registry
from ..dsl.limits import declared_limits
from ..models import DUE_AT, HoldKind, WorkflowHold, WorkflowLimiter, WorkflowRun, WorkflowStep
from ..sql.counting import bounded_pair_counts, distinct_values, planner_estimate
from ..states import RunStatus, StepStatus
from . import limiting
from .fanout_recovery import ended_fan_outs
from .limiting import held_back_counts

#: Why a run counts as stuck, in the order the gauge, the dashboard and the CLI list them.
STUCK_REASONS = ("stalled", "overdue", "waiting_overdue", "paused_on_error", "fan_out_unresolved")
#: Up to this many runs of one class in one status the gauge counts exactly; above, it
#: reports the planner's estimate (the dashboard says "about").
GAUGE_EXACT_UP_TO = 10_000


def status_counts(classes: Sequence[str] | None = None) -> dict[tuple[str, str], int]:
    """``{(class, status): runs}`` over every run: exact up to ``GAUGE_EXACT_UP_TO``, estimated above.

    On PostgreSQL each (class, status) pair is counted in the (class, status) index and the
    count stops at ``GAUGE_EXACT_UP_TO + 1`` (one statement for every pair); a pair above
    that is the planner's estimate, so a count above ``GAUGE_EXACT_UP_TO`` is an estimate
    and the gauge's cost does not grow with the history.
    """
    if not sql.postgresql():
        rows = WorkflowRun.objects.values_list("workflow_class", "status").annotate(n=Count("pk")).order_by()
        return {(klass, status): n for klass, status, n in rows}
    classes = distinct_values(WorkflowRun, "workflow_class") if classes is None else list(classes)
    counted = bounded_pair_counts(WorkflowRun, (classes, list(RunStatus.values)), GAUGE_EXACT_UP_TO)
    for (klass, status), n in counted.items():
        if n > GAUGE_EXACT_UP_TO:
            estimate = planner_estimate(WorkflowRun.objects.filter(workflow_class=klass, status=status))
            counted[(klass, status)] = max(estimate, n)
    return counted


def stuck_querysets(now: datetime, classes: Sequence[str] | None = None) -> dict[str, Any]:
    """One queryset of runs per stuck reason (the gauge counts them; the admin filters by them).

    ``classes``: the runs' classes (every stored class, or fewer), which lets the planner reach
    paused runs through the (class, status) index instead of reading every run.
    """
    threshold = settings.STALL_THRESHOLD
    steps = WorkflowStep.objects.filter(run_id=OuterRef("pk"))
    held = WorkflowHold.objects.active()  # an operator's hold: its due steps wait on purpose, not stuck
    # By the due index's due time: behind a long history, few steps are taken to be overdue,
    # and they are read first, not each ready run's step (1.4 s behind 1,000,000 waiting runs).
    overdue = (
        steps.alias(due_at=DUE_AT)
        .filter(status=StepStatus.SCHEDULED, due_at__lt=now - threshold)
        .exclude(queue__in=held.filter(kind=HoldKind.QUEUE).values("name"))
    )
    runs = WorkflowRun.objects.all() if classes is None else WorkflowRun.objects.filter(workflow_class__in=classes)
    return {
        "stalled": runs.filter(Exists(steps.filter(status=StepStatus.IN_PROGRESS, stall_at__lt=now))),
        "overdue": runs.filter(Exists(_not_held_back(overdue, now - threshold, now)), status=RunStatus.READY).exclude(
            workflow_class__in=held.filter(kind=HoldKind.CLASS).values("name")
        ),
        "waiting_overdue": runs.filter(
            Exists(
                steps.filter(
                    status=StepStatus.WAITING,
                    timeout_at__isnull=True,
                    waiting_since__lt=now - settings.WAITING_VISIBILITY_THRESHOLD,
                )
            ),
            status=RunStatus.WAITING,
        ),
        "paused_on_error": runs.filter(status=RunStatus.PAUSED)
        .annotate(last_step_status=Subquery(steps.order_by("-pk").values("status")[:1]))
        .filter(last_step_status=StepStatus.FAILED),
        # Jobs all ended, the resolution not yet written (the next sweep pass writes it).
        "fan_out_unresolved": runs.filter(Exists(ended_fan_outs().filter(run_id=OuterRef("pk")))),
    }


def _not_held_back(overdue: Any, due_before: datetime, now: datetime) -> Any:
    """The ``overdue`` attempts but those a limit with no room holds back (a step waiting its turn is not stuck).

    The limiters of the attempts under limits due before ``due_before`` are read through their
    partial indexes (``pgbus_wf_step_limited``, ``pgbus_wf_step_parked``), then those rows by name: the
    cost grows with such attempts, never with the queue or the limiters. A step's limiters
    are a JSON array, whose elements ``has_any_keys`` tests (``?|`` on PostgreSQL).
    """
    limited = WorkflowStep.objects.filter(
        status=StepStatus.SCHEDULED, held=False, limiters__isnull=False, scheduled_at__lt=due_before
    )
    names: set[str] = set()
    for parked in (False, True):  # unparked: pgbus_wf_step_limited; parked: pgbus_wf_step_parked (steps under limits)
        rows = limited.filter(parked=parked).values_list("limiters", flat=True)
        names.update(name for limiters in rows for name in limiters or ())
    full = sorted(row.name for row in WorkflowLimiter.objects.filter(name__in=names) if limiting.room(row, now) < 1)
    if not full:
        return overdue
    return overdue.exclude(Q(limiters__isnull=False) & Q(limiters__has_any_keys=full))


def stuck_counts(now: datetime, classes: Sequence[str] | None = None) -> dict[tuple[str, str], int]:
    """``{(class, reason): runs}`` for every stuck reason (``classes``: as ``stuck_querysets``)."""
    counts: dict[tuple[str, str], int] = {}
    for reason, queryset in stuck_querysets(now, classes).items():
        for klass, n in queryset.values_list("workflow_class").annotate(n=Count("pk")).order_by():
            counts[(klass, reason)] = n
    return counts


def gauge(now: datetime) -> dict[str, list[dict[str, Any]]]:
    """The gauge payload: every class x every status and every stuck reason, zero-filled, and the held-back steps.

    Read through indexes only (the class index's values one probe each, bounded counts in
    the (class, status) index, the steps' partial indexes): a count above
    ``GAUGE_EXACT_UP_TO`` is the planner's estimate.
    """
    stored = distinct_values(WorkflowRun, "workflow_class") if sql.postgresql() else None
    statuses, stuck = status_counts(stored), stuck_counts(now, stored)
    classes = sorted({k for k, _ in statuses} | {k for k, _ in stuck} | {c.name for c in registry.classes()})
    held = held_back_counts(now)
    return {
        "statuses": _zero_filled(classes, RunStatus.values, statuses, "status"),
        "stuck": _zero_filled(classes, list(STUCK_REASONS), stuck, "reason"),
        # Per class and step, never per key (keys are unbounded): every limited step, zero-filled.
        "held_back": [
            {"workflow_class": klass, "step": name, "count": held.get((klass, name), 0)}
            for klass, name in sorted(set(held) | limited_steps())
        ],
    }


def limited_steps() -> set[tuple[str, str]]:
    """``(class, step)`` of every registered step under a limit (the gauge reports them even at zero)."""
    return {
        (cls.name, definition.name)
        for cls in registry.classes()
        for definition in cls.step_definitions()
        if declared_limits(cls, definition)
    }


def _zero_filled(
    classes: list[str], values: list[str], counts: dict[tuple[str, str], int], key: str
) -> list[dict[str, Any]]:
    """Every class x every value, so a count that drops to zero is reported as zero."""
    return [{"workflow_class": k, key: v, "count": counts.get((k, v), 0)} for k in classes for v in values]
