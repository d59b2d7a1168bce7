"""The insights rollup: the sweep counts the attempts that finished, per class, step and hour.

The rollup goes as far as every transaction that could still commit an attempt finished before
that time has ended: the sweep takes a checkpoint (a time ``SETTLE`` behind the clock, and the
transactions of this database that hold a transaction id then), and a later sweep adds the
attempts finished up to the checkpoint's time once all of those have ended, committed or not.
Each attempt is added once, to its hour's row; the hour going on is added to sweep by sweep. An
outcome takes its run's row lock (and so its transaction id) before it reads the time it writes
as ``finished_at``; ``SETTLE`` covers a time read up to that long before the lock was granted.
An ``atomic=True`` body's long transaction only delays the rollup. Nothing is added to the hot
path.

Insights (``services.insights``) read the hours from ``WorkflowStepHour`` and, from the
attempts, the part of the window's first hour outside (or inside, whichever is shorter) the
window and what finished since ``rolled_until``, through :func:`attempt_cells` both: one way of
counting, whichever rows it reads. Durations are counted in log-spaced buckets (:func:`bucket`),
eight per doubling from 1 ms, so a percentile read from them is within about 4.5 % of the exact
one. PostgreSQL only: on SQLite insights read the attempts. The same phase, with the same
checkpoints under a mark of its own, rolls up the runs that ended for the funnel
(``services.run_hours``).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, Q, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Trunc

from .. import sql
from ..conf import settings
from ..models import WorkflowRollupMark, WorkflowRun, WorkflowRunHour, WorkflowStep, WorkflowStepHour
from ..states import StepStatus
from .run_hours import RUN_MARK, add_runs, first_run_end

#: The mark's row (``WorkflowRollupMark.name``); the runs' rollup has its own (``run_hours.RUN_MARK``).
MARK = "step_hours"
HOUR = timedelta(hours=1)
#: How far behind the clock a checkpoint's time is: an outcome's time read before its run's lock was granted.
SETTLE = timedelta(minutes=1)
#: Seconds one sweep spends rolling up hours at most (a backlog, after an upgrade, goes on next sweep).
ROLLUP_SECONDS = 5.0
#: Buckets per doubling of a duration, and the upper end of bucket 0 (seconds).
BUCKETS_PER_DOUBLING = 8
SMALLEST = 0.001
#: The endings counted apart, as ``WorkflowStepHour``'s columns.
ENDINGS = {
    "completed": StepStatus.COMPLETED,
    "failed": StepStatus.FAILED,
    "skipped": StepStatus.SKIPPED,
    "cancelled": StepStatus.CANCELLED,
}


@dataclass
class Cell:
    """The attempts of one step (of one class, in one hour or a window): counts and a durations histogram."""

    attempts: int = 0
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0
    reattempts: int = 0
    durations: Counter[int] = field(default_factory=Counter)

    def add(self, other: Cell) -> None:
        """Count ``other``'s attempts too."""
        for name in ("attempts", "reattempts", *ENDINGS):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.durations.update(other.durations)

    def remove(self, other: Cell) -> None:
        """Count ``other``'s attempts no more (they are among this cell's)."""
        for name in ("attempts", "reattempts", *ENDINGS):
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


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour ``moment`` is in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(moment: datetime) -> datetime:
    """The first hour start at or after ``moment``."""
    start = floor_hour(moment)
    return start if start == moment else start + HOUR


def attempt_cells(workflow_class: str | None = None, **finished: datetime) -> dict[tuple[str, str, datetime], Cell]:
    """The attempts finished within ``finished`` (``gt``/``gte``/``lt``/``lte``), by class, step and hour.

    Read through ``pgbus_wf_step_finished``; each attempt's class is a key lookup of its run
    (the planner cannot hash the runs table for it), so the cost is the range's attempts.
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
            hour=Trunc("finished_at", "hour", tzinfo=UTC),
            bucket=RawSQL(bucket_sql, [], output_field=IntegerField()),  # noqa: S611 (constants only)
        )
        .order_by()
        .values("run_class", "step_name", "hour", "bucket")
        .annotate(
            n=Count("*"),
            n_reattempts=Count("pk", filter=Q(attempt__gt=1)),
            **{f"n_{name}": Count("pk", filter=Q(status=status)) for name, status in ENDINGS.items()},
        )
    )
    cells: dict[tuple[str, str, datetime], Cell] = {}
    with sql.uncompiled(rows.db):
        for row in rows:
            cell = cells.setdefault((row["run_class"], row["step_name"], row["hour"]), Cell())
            cell.add(_cell_of(dict(row)))
    return cells


def _cell_of(row: dict[str, Any]) -> Cell:
    cell = Cell(attempts=row["n"], reattempts=row["n_reattempts"], **{name: row[f"n_{name}"] for name in ENDINGS})
    if row["bucket"] is not None:
        cell.durations[row["bucket"]] = row["n"]
    return cell


def hour_cells(workflow_class: str | None, first: datetime, last: datetime) -> dict[tuple[str, str], Cell]:
    """The rolled-up attempts in the hours from ``first`` to ``last`` (both included), by class and step.

    Of ``workflow_class`` only, or of every class (None).
    """
    cells: dict[tuple[str, str], Cell] = {}
    rows = WorkflowStepHour.objects.filter(hour__gte=first, hour__lte=last)
    if workflow_class is not None:
        rows = rows.filter(workflow_class=workflow_class)
    for row in rows.order_by():
        histogram = Counter({int(index): n for index, n in row.durations.items()})
        counts = {name: getattr(row, name) for name in ("attempts", "reattempts", *ENDINGS)}
        cells.setdefault((row.workflow_class, row.step_name), Cell()).add(Cell(**counts, durations=histogram))
    return cells


def window_cells(workflow_class: str | None, since: datetime, now: datetime) -> dict[tuple[str, str], Cell]:
    """The attempts that finished in ``(since, now]``, by class and step (of one class, or of every class: None).

    The hours rolled up so far from ``WorkflowStepHour``; from the attempts, what finished since
    the rollup's end and the window's first hour's part outside the window (taken off) or inside
    it (added), whichever is shorter. PostgreSQL only.
    """
    until = rolled_until()
    cells: dict[tuple[str, str], Cell] = {}
    if until is None or not since < until <= now:
        edges: list[tuple[dict[str, datetime], bool]] = [({"gt": since, "lte": now}, True)]
    else:
        first, ceiling = floor_hour(since), ceil_hour(since)
        if since - first <= ceiling - since or ceiling > until:
            cells = hour_cells(workflow_class, first, floor_hour(until))
            edges = [({"gte": first, "lte": since}, False), ({"gte": until, "lte": now}, True)]
        else:
            cells = hour_cells(workflow_class, ceiling, floor_hour(until))
            edges = [({"gt": since, "lt": ceiling}, True), ({"gte": until, "lte": now}, True)]
    for bounds, counted in edges:
        for (klass, step_name, _), cell in attempt_cells(workflow_class, **bounds).items():
            mine = cells.setdefault((klass, step_name), Cell())
            if counted:
                mine.add(cell)
            else:
                mine.remove(cell)
    return cells


def rolled_until(mark: str = MARK) -> datetime | None:
    """How far the rollup ``mark`` goes: all finished (or ended) before it is counted (None before the first)."""
    return WorkflowRollupMark.objects.filter(name=mark).values_list("rolled_until", flat=True).first()


def roll_up(now: datetime, max_seconds: float = ROLLUP_SECONDS) -> int:
    """The sweep's ``rollups`` phase: roll up the settled hours, take the next checkpoints, drop expired hours.

    Two rollups, each with its own mark: the attempts finished (``WorkflowStepHour``) and the
    runs ended (``WorkflowRunHour``, :func:`add_runs`). Returns how many rows it wrote. Spends at
    most ``max_seconds`` on each (at least one hour when any is due).
    """
    if not sql.postgresql():
        return 0
    written = _roll(MARK, _first_hour, _add_range, now, max_seconds)
    written += _roll(RUN_MARK, first_run_end, add_runs, now, max_seconds)
    if settings.RETENTION is not None:
        WorkflowStepHour.objects.filter(hour__lt=now - settings.RETENTION - HOUR).delete()
        WorkflowRunHour.objects.filter(hour__lt=now - settings.RETENTION - HOUR).delete()
    return written


def _roll(
    name: str,
    first_hour: Callable[[], datetime | None],
    add: Callable[[datetime, datetime], int],
    now: datetime,
    max_seconds: float,
) -> int:
    """Move the mark ``name`` up to its checkpoint if settled (``add`` an hour at a time), then take the next."""
    with transaction.atomic():
        mark, _ = WorkflowRollupMark.objects.select_for_update().get_or_create(name=name)
        written = 0
        caught_up = mark.checkpoint_at is None
        if mark.checkpoint_at is not None and not _still_open(mark.checkpoint_xids):
            settled = mark.checkpoint_at
            start = mark.rolled_until or first_hour() or settled
            deadline = time.monotonic() + max_seconds
            hours = 0
            while start < settled and (hours == 0 or time.monotonic() < deadline):
                end = min(floor_hour(start) + HOUR, settled)
                written += add(start, end)
                start = end
                hours += 1
            mark.rolled_until = max(start, mark.rolled_until or start)
            caught_up = start >= settled
        if caught_up:
            mark.checkpoint_at = now - SETTLE
            mark.checkpoint_xids = _open_here()
        mark.save()
    return written


def _open_here() -> list[int]:
    """The transactions of this database that hold a transaction id now (other than this session's)."""
    with sql.cursor() as cursor:
        cursor.execute(sql.statement("open_transactions_here"))
        return sorted(xid for (xid,) in cursor.fetchall())


def _still_open(xids: list[int]) -> bool:
    """Whether any of the transactions ``xids`` has not ended yet."""
    if not xids:
        return False
    with sql.cursor() as cursor:
        cursor.execute(sql.statement("transactions_still_open"), [xids])
        return bool(cursor.fetchone()[0])


def _first_hour() -> datetime | None:
    first = WorkflowStep.objects.filter(finished_at__isnull=False).order_by("finished_at").values("finished_at")[:1]
    moment = first.values_list("finished_at", flat=True).first()
    return None if moment is None else floor_hour(moment)


def _add_range(start: datetime, end: datetime) -> int:
    """Add the attempts finished from ``start`` up to ``end`` (within one hour) to their hour's rows."""
    cells = attempt_cells(gte=start, lt=end)
    if not cells:
        return 0
    kept = WorkflowStepHour.objects.filter(hour=floor_hour(start))  # the mark's lock keeps other sweeps out
    for row in kept:
        key = (row.workflow_class, row.step_name, row.hour)
        if key in cells:
            counts = {name: getattr(row, name) for name in ("attempts", "reattempts", *ENDINGS)}
            histogram = Counter({int(index): n for index, n in row.durations.items()})
            cells[key].add(Cell(**counts, durations=histogram))
    WorkflowStepHour.objects.bulk_create(
        [
            WorkflowStepHour(
                workflow_class=workflow_class,
                step_name=step_name,
                hour=hour,
                attempts=cell.attempts,
                reattempts=cell.reattempts,
                durations={str(index): n for index, n in sorted(cell.durations.items())},
                **{name: getattr(cell, name) for name in ENDINGS},
            )
            for (workflow_class, step_name, hour), cell in cells.items()
        ],
        update_conflicts=True,
        unique_fields=["workflow_class", "hour", "step_name"],
        update_fields=["attempts", "reattempts", "durations", *ENDINGS],
    )
    return len(cells)
