"""Insights' funnel rollup: the runs that ended, counted by class, the hour they started in, and step.

The sweep's ``rollups`` phase (``services.rollups.roll_up``, with the same checkpoints as the
attempts' rollup, under its own mark ``run_hours``) adds each run once it has finished or been
cancelled, by the time it ended (``status_changed_at``, written with its run's lock held, as an
attempt's ``finished_at`` is): a run that ends does not change again, so the row of the hour it
started in counts it for good. Insights (``services.insights``) read those rows for the runs a
window started that had ended before the rollup's end, and the other runs of the window, through
:func:`run_funnels` both: one way of counting, whichever rows it reads. PostgreSQL only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Count
from django.db.models.functions import Trunc

from .. import sql
from ..models import WorkflowRun, WorkflowRunHour, WorkflowStep
from ..states import TERMINAL_RUN, RunStatus

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
    """The runs that match ``runs`` (``WorkflowRun`` lookups), counted by class and the hour they started in.

    Reached steps are the runs' attempts' names (``pgbus_wf_step_run_name``), each run once a step.
    """
    found: dict[tuple[str, datetime], Funnel] = {}
    at = WorkflowRun.objects.filter(**runs).annotate(hour=Trunc("started_at", "hour", tzinfo=UTC)).order_by()
    attempts = WorkflowStep.objects.filter(**{f"run__{lookup}": value for lookup, value in runs.items()})
    rows = (
        attempts.annotate(hour=Trunc("run__started_at", "hour", tzinfo=UTC))
        .order_by()
        .values("run__workflow_class", "hour", "step_name")
        .annotate(n=Count("run_id", distinct=True))
    )
    with sql.uncompiled(at.db):
        for row in at.values("workflow_class", "hour", "current_step", "status").annotate(n=Count("*")):
            key = (row["workflow_class"], row["hour"])
            found.setdefault(key, Funnel()).at[(row["current_step"], row["status"])] += row["n"]
        for reached in rows:
            key = (reached["run__workflow_class"], reached["hour"])
            found.setdefault(key, Funnel()).reached[reached["step_name"]] += reached["n"]
    return found


def hour_funnel(workflow_class: str, first: datetime, last: datetime) -> Funnel:
    """The rolled-up ended runs of ``workflow_class`` started in the hours ``first`` to ``last`` (included)."""
    funnel = Funnel()
    rows = WorkflowRunHour.objects.filter(workflow_class=workflow_class, hour__gte=first, hour__lte=last)
    for row in rows.order_by():
        funnel.add(_row_funnel(row))
    return funnel


def _row_funnel(row: WorkflowRunHour) -> Funnel:
    funnel = Funnel(reached=Counter({row.step_name: row.reached}))
    for name, status in RUN_ENDINGS.items():
        funnel.at[(row.step_name, str(status))] = getattr(row, name)
    return funnel


def first_run_end() -> datetime | None:
    """When the first ended run ended (``pgbus_wf_run_retention``): where the rollup starts."""
    ended = WorkflowRun.objects.filter(status__in=sorted(TERMINAL_RUN)).order_by("status_changed_at")
    return ended.values_list("status_changed_at", flat=True).first()


def add_runs(start: datetime, end: datetime) -> int:
    """Add the runs that ended from ``start`` up to ``end`` to the rows of the hours they started in.

    Read through ``pgbus_wf_run_retention``: the cost is the range's ended runs. An ended run
    does not change again (no transition leaves ``finished`` or ``cancelled``).
    """
    found = run_funnels(status__in=sorted(TERMINAL_RUN), status_changed_at__gte=start, status_changed_at__lt=end)
    if not found:
        return 0
    cells: dict[tuple[str, datetime, str], Funnel] = {}
    for (klass, hour), funnel in found.items():
        for step_name in {name for name, _ in funnel.at} | set(funnel.reached):
            cell = cells.setdefault((klass, hour, step_name), Funnel())
            cell.reached[step_name] = funnel.reached[step_name]
            for status in RUN_ENDINGS.values():
                cell.at[(step_name, str(status))] = funnel.at[(step_name, str(status))]
    kept = WorkflowRunHour.objects.filter(  # the mark's lock keeps other sweeps out
        workflow_class__in={klass for klass, _, _ in cells}, hour__in={hour for _, hour, _ in cells}
    )
    for row in kept:
        if (key := (row.workflow_class, row.hour, row.step_name)) in cells:
            cells[key].add(_row_funnel(row))
    WorkflowRunHour.objects.bulk_create(
        [
            WorkflowRunHour(
                workflow_class=klass,
                hour=hour,
                step_name=step_name,
                reached=cell.reached[step_name],
                **{name: cell.at[(step_name, str(status))] for name, status in RUN_ENDINGS.items()},
            )
            for (klass, hour, step_name), cell in cells.items()
        ],
        update_conflicts=True,
        unique_fields=["workflow_class", "hour", "step_name"],
        update_fields=["reached", *RUN_ENDINGS],
    )
    return len(cells)
