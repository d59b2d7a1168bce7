"""Counting attempts into cells: per class, step and period, how many, how they ended, and their durations.

One way of counting, whichever rows it reads: the rollup (``services.rollups``) counts the
attempts that finished into its hours and spans, and insights read those rows back, and the
attempts at a window's edges, as the same :class:`Cell`. Durations are counted in log-spaced
buckets (:func:`bucket`), eight per doubling from 1 ms, so a percentile read from them is
within about 4.5 % of the exact one.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Count, IntegerField, OuterRef, Q, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Trunc

from .. import sql
from ..models import WorkflowRun, WorkflowStep
from ..models.rollups import StepCounts
from ..states import StepStatus
from .periods import floor_span

#: Buckets per doubling of a duration, and the upper end of bucket 0 (seconds).
BUCKETS_PER_DOUBLING = 8
SMALLEST = 0.001
#: The endings counted apart, as ``StepCounts``' columns.
ENDINGS = {
    "completed": StepStatus.COMPLETED,
    "failed": StepStatus.FAILED,
    "skipped": StepStatus.SKIPPED,
    "cancelled": StepStatus.CANCELLED,
}
#: The counts of a cell, as ``StepCounts``' columns (the histogram apart).
COUNTS = ("attempts", "reattempts", *ENDINGS)


@dataclass
class Cell:
    """The attempts of one step (of one class, in one period or a window): counts and a durations histogram."""

    attempts: int = 0
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0
    reattempts: int = 0
    durations: Counter[int] = field(default_factory=Counter)

    def add(self, other: Cell) -> None:
        """Count ``other``'s attempts too."""
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.durations.update(other.durations)

    def remove(self, other: Cell) -> None:
        """Count ``other``'s attempts no more (they are among this cell's)."""
        for name in COUNTS:
            setattr(self, name, getattr(self, name) - getattr(other, name))
        self.durations.subtract(other.durations)
        self.durations = +self.durations  # drop the buckets emptied

    def percentile(self, fraction: float) -> float | None:
        """The duration (seconds) ``fraction`` of the way through the timed attempts, as ``percentile_cont``.

        Each attempt's duration is taken as a point in its bucket (the attempts of a bucket
        spread evenly over it, geometrically), and the two around the rank interpolated.
        """
        total = sum(self.durations.values())
        if not total:
            return None
        rank = fraction * (total - 1)
        below = self._nth(math.floor(rank))
        return below + (rank - math.floor(rank)) * (self._nth(math.ceil(rank)) - below)

    def _nth(self, position: int) -> float:
        """The estimated duration of the timed attempt at ``position`` (0-based) in duration order."""
        before = 0
        for index in sorted(self.durations):
            count = self.durations[index]
            if position < before + count:
                low, high = bucket_bounds(index)
                share = (position - before + 0.5) / count
                return high * share if index == 0 else low * (high / low) ** share
            before += count
        return bucket_bounds(max(self.durations))[1]


def bucket(seconds: float) -> int:
    """The histogram bucket of a duration: 0 below 1 ms, then eight per doubling."""
    if seconds < SMALLEST:
        return 0
    return 1 + math.floor(BUCKETS_PER_DOUBLING * math.log2(seconds / SMALLEST))


def bucket_bounds(index: int) -> tuple[float, float]:
    """The durations (seconds) bucket ``index`` holds: ``[low, high)``."""
    if index == 0:
        return 0.0, SMALLEST
    return SMALLEST * 2 ** ((index - 1) / BUCKETS_PER_DOUBLING), SMALLEST * 2 ** (index / BUCKETS_PER_DOUBLING)


def attempt_cells(workflow_class: str | None = None, **finished: datetime) -> dict[tuple[str, str, datetime], Cell]:
    """The attempts finished within ``finished`` (``gt``/``gte``/``lt``/``lte``), by class, step and span's start.

    Read through ``pgbus_wf_step_finished``; each attempt's class is a key lookup of its run
    (the planner cannot hash the runs table for it), so the cost is the range's attempts.
    PostgreSQL only.
    """
    class_of_run = WorkflowRun.objects.filter(pk=OuterRef("run_id")).values("workflow_class")[:1]
    table = WorkflowStep._meta.db_table
    seconds = f'EXTRACT(EPOCH FROM "{table}"."finished_at" - "{table}"."started_at")'
    bucket_sql = (
        f'CASE WHEN "{table}"."started_at" IS NULL THEN NULL WHEN {seconds} < {SMALLEST} THEN 0 '
        f"ELSE 1 + floor({BUCKETS_PER_DOUBLING} * ln({seconds} / {SMALLEST}) / ln(2))::int END"
    )
    attempts = WorkflowStep.objects.filter(**{f"finished_at__{op}": moment for op, moment in finished.items()})
    attempts = attempts.annotate(run_class=Subquery(class_of_run))
    if workflow_class is not None:
        attempts = attempts.filter(**{"run_class": workflow_class})  # an annotation the stubs cannot see
    rows = (
        attempts.annotate(
            minute=Trunc("finished_at", "minute", tzinfo=UTC),
            bucket=RawSQL(bucket_sql, [], output_field=IntegerField()),  # noqa: S611 (constants only)
        )
        .order_by()
        .values("run_class", "step_name", "minute", "bucket")
        .annotate(
            n=Count("*"),
            n_reattempts=Count("pk", filter=Q(attempt__gt=1)),
            **{f"n_{name}": Count("pk", filter=Q(status=status)) for name, status in ENDINGS.items()},
        )
    )
    cells: dict[tuple[str, str, datetime], Cell] = {}
    with sql.uncompiled(rows.db):
        for row in rows:
            cell = cells.setdefault((row["run_class"], row["step_name"], floor_span(row["minute"])), Cell())
            cell.add(_cell_of(dict(row)))
    return cells


def _cell_of(row: dict[str, Any]) -> Cell:
    cell = Cell(attempts=row["n"], reattempts=row["n_reattempts"], **{name: row[f"n_{name}"] for name in ENDINGS})
    if row["bucket"] is not None:
        cell.durations[row["bucket"]] = row["n"]
    return cell


def stored_cell(row: StepCounts) -> Cell:
    """The attempts a rollup's row (an hour's or a span's) counts."""
    histogram = Counter({int(index): n for index, n in row.durations.items()})
    return Cell(**{name: getattr(row, name) for name in COUNTS}, durations=histogram)


def stored_row(cell: Cell) -> dict[str, Any]:
    """A cell as a rollup row's columns."""
    return {
        **{name: getattr(cell, name) for name in COUNTS},
        "durations": {str(index): n for index, n in sorted(cell.durations.items())},
    }
