"""Insights' funnel rollup: the runs that ended, by class, the hour (and five-minute span) they started in, and step.

The sweep's ``rollups`` phase (``services.rollups.roll_up``, with the same checkpoints as the
attempts' rollup, under its own mark ``run_hours``) adds each run once it has finished or been
cancelled, by the time it ended (``status_changed_at``, written with its run's lock held, as an
attempt's ``finished_at`` is): a run that ends does not change again, so the rows of the hour
and the span it started in count it for good. Insights (``services.insights``) read those rows
for the runs a window started that had ended before the rollup's end, and the other runs of the
window, through :func:`run_funnels` both: one way of counting, whichever rows it reads.
PostgreSQL only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.db.models import Count, QuerySet
from django.db.models.functions import Trunc

from .. import sql
from ..models import WorkflowRun, WorkflowRunHour, WorkflowRunSpan, WorkflowStep
from ..models.rollups import RunCounts
from ..states import TERMINAL_RUN, RunStatus
from .periods import floor_hour, floor_span

_Row = TypeVar("_Row", WorkflowRunHour, WorkflowRunSpan)

#: The mark's row (``WorkflowRollupMark.name``).
RUN_MARK = "run_hours"
#: The statuses a run ends in, as ``WorkflowRunHour``'s columns.
RUN_ENDINGS = {"finished": RunStatus.FINISHED, "cancelled": RunStatus.CANCELLED}


@dataclass
class Funnel:
    """Runs counted for insights' funnel: how many are at each (step, status), how many reached each step."""

    at: Counter[tuple[str, str]] = field(default_factory=Counter)
    reached: Counter[str] = field(default_factory=Counter)

    def add(self, other: Funnel, sign: int = 1) -> None:
        """Count ``other``'s runs too (``sign=-1``: no more; they are among these)."""
        for key, n in other.at.items():
            self.at[key] += sign * n
        for name, n in other.reached.items():
            self.reached[name] += sign * n


def run_funnels(**runs: Any) -> dict[tuple[str, datetime], Funnel]:
    """The runs that match ``runs`` (``WorkflowRun`` lookups), counted by class and the span they started in.

    Reached steps are the runs' attempts' names (``pgbus_wf_step_run_name``), each run once a
    step (a run starts in one minute, so counting distinct runs by minute counts each once).
    """
    found: dict[tuple[str, datetime], Funnel] = {}
    at = WorkflowRun.objects.filter(**runs).annotate(minute=Trunc("started_at", "minute", tzinfo=UTC)).order_by()
    attempts = WorkflowStep.objects.filter(**{f"run__{lookup}": value for lookup, value in runs.items()})
    rows = (
        attempts.annotate(minute=Trunc("run__started_at", "minute", tzinfo=UTC))
        .order_by()
        .values("run__workflow_class", "minute", "step_name")
        .annotate(n=Count("run_id", distinct=True))
    )
    with sql.uncompiled(at.db):
        for row in at.values("workflow_class", "minute", "current_step", "status").annotate(n=Count("*")):
            key = (row["workflow_class"], floor_span(row["minute"]))
            found.setdefault(key, Funnel()).at[(row["current_step"], row["status"])] += row["n"]
        for reached in rows:
            key = (reached["run__workflow_class"], floor_span(reached["minute"]))
            found.setdefault(key, Funnel()).reached[reached["step_name"]] += reached["n"]
    return found


def hour_funnel(workflow_class: str, first: datetime, last: datetime) -> Funnel:
    """The rolled-up ended runs of ``workflow_class`` started in the hours ``first`` to ``last`` (included)."""
    return _stored_funnel(
        WorkflowRunHour.objects.filter(workflow_class=workflow_class, hour__gte=first, hour__lte=last)
    )


def span_funnel(workflow_class: str, first: datetime, last: datetime) -> Funnel:
    """The rolled-up ended runs of ``workflow_class`` started in the spans starting ``first`` to ``last`` (included)."""
    return _stored_funnel(
        WorkflowRunSpan.objects.filter(workflow_class=workflow_class, start__gte=first, start__lte=last)
    )


def _stored_funnel(rows: QuerySet[WorkflowRunHour] | QuerySet[WorkflowRunSpan]) -> Funnel:
    funnel = Funnel()
    for row in rows.order_by():
        funnel.add(_row_funnel(row))
    return funnel


def _row_funnel(row: RunCounts) -> Funnel:
    funnel = Funnel(reached=Counter({row.step_name: row.reached}))
    for name, status in RUN_ENDINGS.items():
        funnel.at[(row.step_name, str(status))] = getattr(row, name)
    return funnel


def first_run_end() -> datetime | None:
    """When the first ended run ended (``pgbus_wf_run_retention``): where the rollup starts."""
    ended = WorkflowRun.objects.filter(status__in=sorted(TERMINAL_RUN)).order_by("status_changed_at")
    return ended.values_list("status_changed_at", flat=True).first()


def add_runs(start: datetime, end: datetime, spans_from: datetime) -> int:
    """Add the runs that ended from ``start`` up to ``end`` to the rows of the hour and span they started in.

    Read through ``pgbus_wf_run_retention``: the cost is the range's ended runs. An ended run
    does not change again (no transition leaves ``finished`` or ``cancelled``). Spans before
    ``spans_from`` are not written (the runs started there may have ended before the spans began).
    """
    found = run_funnels(status__in=sorted(TERMINAL_RUN), status_changed_at__gte=start, status_changed_at__lt=end)
    by_hour: dict[tuple[str, datetime], Funnel] = {}
    for (klass, span), funnel in found.items():
        by_hour.setdefault((klass, floor_hour(span)), Funnel()).add(funnel)
    spans = {key: funnel for key, funnel in found.items() if key[1] >= spans_from}
    return _write(WorkflowRunHour, "hour", by_hour) + _write(WorkflowRunSpan, "start", spans)


def _write(model: type[_Row], period: str, found: dict[tuple[str, datetime], Funnel]) -> int:
    """Add ``found`` (by class and period's start) to ``model``'s rows by step; the mark's lock keeps sweeps out."""
    cells: dict[tuple[str, datetime, str], Funnel] = {}
    for (klass, moment), funnel in found.items():
        for step_name in {name for name, _ in funnel.at} | set(funnel.reached):
            cell = cells.setdefault((klass, moment, step_name), Funnel())
            cell.reached[step_name] = funnel.reached[step_name]
            for status in RUN_ENDINGS.values():
                cell.at[(step_name, str(status))] = funnel.at[(step_name, str(status))]
    if not cells:
        return 0
    kept = model._default_manager.filter(
        workflow_class__in={klass for klass, _, _ in cells}, **{f"{period}__in": {moment for _, moment, _ in cells}}
    )
    for row in kept:
        if (key := (row.workflow_class, getattr(row, period), row.step_name)) in cells:
            cells[key].add(_row_funnel(row))
    model._default_manager.bulk_create(
        [
            model(
                workflow_class=klass,
                step_name=step_name,
                reached=cell.reached[step_name],
                **{period: moment},
                **{name: cell.at[(step_name, str(status))] for name, status in RUN_ENDINGS.items()},
            )
            for (klass, moment, step_name), cell in cells.items()
        ],
        update_conflicts=True,
        unique_fields=["workflow_class", period, "step_name"],
        update_fields=["reached", *RUN_ENDINGS],
    )
    return len(cells)
