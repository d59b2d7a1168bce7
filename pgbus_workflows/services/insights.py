"""Insights on one workflow class: its pipeline, its steps' performance and its funnel.

- **Pipeline**: the class's ongoing runs at each step, by status (``pgbus_wf_run_pipeline``, a
  partial index of ongoing runs: finished history costs it nothing); the ready runs a limit
  holds back apart from the others (``held_back``).
- **Performance**: the attempts that finished in the window, by step: how many, how many
  completed, failed, were skipped or cancelled, how many were reattempts, and the p50/p95 of
  their duration (claim to end). On PostgreSQL the hours come from the rollup the sweep keeps
  (``services.rollups``: the cost does not grow with the window's volume) and the window's edges
  from the attempts; p50/p95 come from a histogram of the durations (within about 4.5 %).
- **Funnel**: of the runs the window started, how many reached each step (an attempt of it
  exists, ``pgbus_wf_step_run_name``), and where the others are or stopped, in which status. On
  PostgreSQL the runs that had ended before the rollup's end come from the hours of their starts
  (``services.run_hours``), and the window's edges, its ongoing runs (``pgbus_wf_run_pipeline``)
  and the runs ended since, from the runs: the cost grows with the ongoing runs, not with the
  history. Retention deletes finished runs whole, so a window longer than ``RETENTION`` counts
  only the runs kept (read from the runs: the rollup would count the deleted ones too).

The admin's insights page and the MCP tool ``insights`` read :func:`class_insights`; it writes nothing.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, OuterRef, Q, QuerySet, Subquery

from .. import sql
from ..conf import settings
from ..dsl.declared import registry
from ..models import WorkflowRun, WorkflowStep
from ..sql import clock
from ..states import ONGOING_RUN, TERMINAL_RUN, RunStatus, StepStatus
from . import periods, rollups
from .attempt_cells import ENDINGS as CELL_ENDINGS
from .attempt_cells import Cell
from .limiting import held_back_counts
from .run_hours import RUN_MARK, Funnel, hour_funnel, run_funnels, span_funnel

#: The windows an operator may pick, by the label the page and the MCP tool take.
WINDOWS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
DEFAULT_WINDOW = "24h"
#: The ongoing statuses in the order the pipeline shows them.
PIPELINE_STATUSES = [RunStatus.READY, RunStatus.PERFORMING, RunStatus.WAITING, RunStatus.PAUSED]
#: The pipeline's column of ready runs whose due step a limit with no room holds back (not counted as ready).
HELD_BACK = "held_back"
#: The pipeline's columns, in order: the ready runs a limit holds back next to those it does not.
PIPELINE_COLUMNS = [str(RunStatus.READY), HELD_BACK, *(str(s) for s in PIPELINE_STATUSES[1:])]
#: How the attempts of a step ended, in the order the performance table shows them.
ENDINGS = [StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED]


def class_insights(workflow_class: str, window: timedelta, now: datetime | None = None) -> dict[str, Any]:
    """The pipeline, step performance and funnel of ``workflow_class`` over ``window`` before ``now``.

    JSON-ready (durations in seconds, times in ISO 8601). Raises ``LookupError`` when no class is
    registered under that name and no run of it is stored.
    """
    now = now or clock.now()
    since = now - window
    runs = WorkflowRun.objects.filter(workflow_class=workflow_class)
    declared = registry.get(workflow_class)
    # ordered as the class's start index is, so the probe walks it (not the table) to the first row
    if declared is None and runs.order_by("started_at").values_list("pk", flat=True).first() is None:
        raise LookupError(f"No workflow class {workflow_class!r}: none is registered under that name, no run is stored")
    pipeline = _pipeline(runs, workflow_class, now)
    performance = _performance(workflow_class, since, now)
    funnel = _funnel(workflow_class, since, now)
    names = [d.name for d in declared.step_definitions()] if declared is not None else []
    seen = {row["step"] for row in pipeline} | {row["step"] for row in performance} | set(funnel["reached"])
    steps = names + sorted(seen - set(names) - {""})
    return {
        "workflow_class": workflow_class,
        "registered": declared is not None,
        "since": since.isoformat(),
        "now": now.isoformat(),
        "window_seconds": window.total_seconds(),
        "steps": steps,
        "pipeline": _in_order(pipeline, steps),
        "performance": _in_order(performance, steps),
        "funnel": _funnel_steps(funnel, steps),
    }


def _in_order(rows: list[dict[str, Any]], steps: list[str]) -> list[dict[str, Any]]:
    position = {name: index for index, name in enumerate(steps)}
    return sorted(rows, key=lambda row: position.get(row["step"], len(steps)))


def _pipeline(runs: QuerySet[WorkflowRun], workflow_class: str, now: datetime) -> list[dict[str, Any]]:
    """Ongoing runs by (current step, status): ``COUNT(*)`` so the partial index answers alone.

    A ready run whose due attempt a limit with no room holds back (``limiting.held_back_counts``)
    is counted under ``held_back``, not ``ready``: it starts when a slot frees or a token comes.
    """
    counts = (
        runs.filter(status__in=sorted(ONGOING_RUN))
        .values_list("current_step", "status")
        .annotate(n=Count("*"))
        .order_by()
    )
    by_step: dict[str, dict[str, int]] = {}
    for step_name, status, n in counts:
        by_step.setdefault(step_name, dict.fromkeys(PIPELINE_COLUMNS, 0))[status] = n
    held = {step: n for (klass, step), n in held_back_counts(now).items() if klass == workflow_class}
    for step_name, cells in by_step.items():
        cells[HELD_BACK] = min(held.get(step_name, 0), cells[RunStatus.READY])
        cells[RunStatus.READY] -= cells[HELD_BACK]
    return [{"step": name, "counts": cells, "total": sum(cells.values())} for name, cells in by_step.items()]


def _performance(workflow_class: str, since: datetime, now: datetime) -> list[dict[str, Any]]:
    """The attempts of the class that finished in ``(since, now]``, by step.

    On PostgreSQL from the rollup and the window's edges (``services.rollups.window_cells``).
    """
    if not sql.postgresql():
        return _performance_sqlite(workflow_class, since, now)
    cells = rollups.window_cells(workflow_class, since, now)
    return [_cell_row(step_name, cell) for (_, step_name), cell in cells.items() if cell.attempts]


def _cell_row(step_name: str, cell: Cell) -> dict[str, Any]:
    return {
        "step": step_name,
        "attempts": cell.attempts,
        **{str(status): getattr(cell, name) for name, status in CELL_ENDINGS.items()},
        "reattempts": cell.reattempts,
        "failure_rate": cell.failed / cell.attempts,
        "reattempt_rate": cell.reattempts / cell.attempts,
        "p50_seconds": cell.percentile(0.5),
        "p95_seconds": cell.percentile(0.95),
    }


def _performance_sqlite(workflow_class: str, since: datetime, now: datetime) -> list[dict[str, Any]]:
    """SQLite: the window's attempts read and their exact percentiles computed here."""
    class_of_run = WorkflowRun.objects.filter(pk=OuterRef("run_id")).values("workflow_class")[:1]
    attempts = (
        WorkflowStep.objects.filter(finished_at__gt=since, finished_at__lte=now)
        .alias(run_class=Subquery(class_of_run))
        .filter(run_class=workflow_class)
        .order_by()
    )
    endings = {str(status): Count("pk", filter=Q(status=status)) for status in ENDINGS}
    rows = attempts.values("step_name").annotate(attempts=Count("*"), reattempts=Count("pk", filter=Q(attempt__gt=1)))
    found: list[dict[str, Any]] = [dict(row) for row in rows.annotate(**endings)]
    durations = _durations(attempts)
    for row in found:
        row["p50"], row["p95"] = _percentiles(durations.get(row["step_name"], []))
    return [_performance_row(row) for row in found]


def _durations(attempts: QuerySet[WorkflowStep]) -> dict[str, list[float]]:
    by_step: dict[str, list[float]] = {}
    started = attempts.filter(started_at__isnull=False)
    for name, started_at, finished_at in started.values_list("step_name", "started_at", "finished_at"):
        if started_at is not None and finished_at is not None:  # the filters say so; the types do not
            by_step.setdefault(name, []).append((finished_at - started_at).total_seconds())
    return by_step


def _percentiles(values: list[float]) -> tuple[timedelta | None, timedelta | None]:
    """p50 and p95 interpolated as ``percentile_cont`` does them."""
    if not values:
        return None, None
    if len(values) == 1:
        return timedelta(seconds=values[0]), timedelta(seconds=values[0])
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return timedelta(seconds=cuts[49]), timedelta(seconds=cuts[94])


def _performance_row(row: dict[str, Any]) -> dict[str, Any]:
    attempts = row["attempts"]
    return {
        "step": row["step_name"],
        "attempts": attempts,
        **{str(status): row[str(status)] for status in ENDINGS},
        "reattempts": row["reattempts"],
        "failure_rate": row[str(StepStatus.FAILED)] / attempts,
        "reattempt_rate": row["reattempts"] / attempts,
        "p50_seconds": None if row["p50"] is None else row["p50"].total_seconds(),
        "p95_seconds": None if row["p95"] is None else row["p95"].total_seconds(),
    }


def _funnel(workflow_class: str, since: datetime, now: datetime) -> dict[str, Any]:
    """How many runs the window started, where each is now, and which steps each reached.

    On PostgreSQL, once the runs' rollup has passed ``since`` and retention deletes no run of
    the window: the rolled-up hours and spans of the window's starts (``periods.window_start``:
    the ended runs between the nearest span boundary and ``since`` added or taken off; the runs
    started after ``now`` in its last hour taken off), then the window's ongoing runs and those
    ended since the rollup's end.
    """
    counted = _funnel_counts(workflow_class, since, now)
    at: dict[str, dict[str, int]] = {}
    for (step_name, status), n in counted.at.items():
        if n:
            at.setdefault(step_name, {})[status] = n
    return {"at": at, "reached": {name: n for name, n in counted.reached.items() if n}}


def _funnel_counts(workflow_class: str, since: datetime, now: datetime) -> Funnel:
    return rollups.consistent(RUN_MARK, lambda reached: _funnel_read(workflow_class, since, now, *reached))


def _funnel_read(
    workflow_class: str, since: datetime, now: datetime, until: datetime | None, spans_from: datetime | None
) -> Funnel:
    window = {"workflow_class": workflow_class, "started_at__gt": since, "started_at__lte": now}
    last = periods.floor_hour(now)
    kept = settings.RETENTION is None or periods.floor_hour(since) >= clock.now() - settings.RETENTION
    if not sql.postgresql() or until is None or not since < until or not kept:
        return _total(**window)
    ended = {"workflow_class": workflow_class, "status__in": sorted(TERMINAL_RUN), "status_changed_at__lt": until}
    start = periods.window_start(since, until, spans_from)
    counted = hour_funnel(workflow_class, start.hour, last)
    if spans := start.spans():
        first, final, sign = spans
        counted.add(span_funnel(workflow_class, first, final), sign)
    rows, sign = start.rows()
    counted.add(_total(**ended, **{f"started_at__{op}": moment for op, moment in rows.items()}), sign)
    counted.add(_total(**ended, started_at__gt=now, started_at__lt=last + periods.HOUR), -1)
    counted.add(_total(**window, status__in=sorted(ONGOING_RUN)))
    counted.add(_total(**window, status__in=sorted(TERMINAL_RUN), status_changed_at__gte=until))
    return counted


def _total(**runs: Any) -> Funnel:
    """The runs that match ``runs``, counted whatever their hour."""
    total = Funnel()
    for counted in run_funnels(**runs).values():
        total.add(counted)
    return total


def _funnel_steps(funnel: dict[str, Any], steps: list[str]) -> dict[str, Any]:
    """The funnel in step order: reached (and its share of the started), and the runs at each step now."""
    at: dict[str, dict[str, int]] = funnel["at"]
    started = sum(sum(cells.values()) for cells in at.values())
    finished = sum(cells.get(RunStatus.FINISHED, 0) for cells in at.values())
    rows = []
    for name in steps:
        here = {status: n for status, n in at.get(name, {}).items() if status != RunStatus.FINISHED}
        reached = funnel["reached"].get(name, 0)
        rows.append(
            {
                "step": name,
                "reached": reached,
                "reached_rate": reached / started if started else None,
                "here": here,
            }
        )
    return {"started": started, "finished": finished, "steps": rows}
