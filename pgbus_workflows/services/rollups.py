"""The insights rollup: the sweep counts the attempts that finished, per class, step and hour, and five-minute span.

The rollup goes as far as every transaction that could still commit an attempt finished before
that time has ended: the sweep takes a checkpoint (a time ``SETTLE`` behind the clock, and the
transactions of this database that hold a transaction id then), and a later sweep adds the
attempts finished up to the checkpoint's time once all of those have ended, committed or not.
Each attempt is added once, to its hour's row and its span's; the hour going on is added to
sweep by sweep. An outcome takes its run's row lock (and so its transaction id) before it reads
the time it writes as ``finished_at``; ``SETTLE`` covers a time read up to that long before the
lock was granted. An ``atomic=True`` body's long transaction only delays the rollup. Nothing is
added to the hot path.

Insights (``services.insights``) read the hours from ``WorkflowStepHour``, the spans at the
window's start from ``WorkflowStepSpan`` (``periods.window_start``), and from the attempts the
rest: at most half a span at the window's start, and what finished since ``rolled_until``,
through ``attempt_cells.attempt_cells`` both: one way of counting, whichever rows it reads.
Spans are kept ``periods.SPANS_KEPT``, hours as long as ``RETENTION``. PostgreSQL only: on
SQLite insights read the attempts. The same phase, with the same checkpoints under a mark of
its own, rolls up the runs that ended for the funnel (``services.run_hours``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from django.db import models, transaction

from .. import sql
from ..conf import settings
from ..models import (
    WorkflowRollupMark,
    WorkflowRunHour,
    WorkflowRunSpan,
    WorkflowStep,
    WorkflowStepHour,
    WorkflowStepSpan,
)
from .attempt_cells import Cell, attempt_cells, stored_cell, stored_row
from .periods import HOUR, SPANS_KEPT, ceil_span, floor_hour, floor_span, window_start
from .run_hours import RUN_MARK, add_runs, first_run_end

_Row = TypeVar("_Row", WorkflowStepHour, WorkflowStepSpan)
_Read = TypeVar("_Read")

#: The mark's row (``WorkflowRollupMark.name``); the runs' rollup has its own (``run_hours.RUN_MARK``).
MARK = "step_hours"
#: How far behind the clock a checkpoint's time is: an outcome's time read before its run's lock was granted.
SETTLE = timedelta(minutes=1)
#: Seconds one sweep spends rolling up hours at most (a backlog, after an upgrade, goes on next sweep).
ROLLUP_SECONDS = 5.0
#: How many times a read goes at most while sweeps move the mark during it (the last read is a sweep off at most).
READ_TRIES = 10


@dataclass(frozen=True)
class Rollup:
    """One rollup: its mark, where its history begins, how it adds a range (within an hour), and its tables."""

    mark: str
    first_hour: Callable[[], datetime | None]
    #: ``add(start, end, spans_from)``: the rows written; spans only from ``spans_from`` on.
    add: Callable[[datetime, datetime, datetime], int]
    hours: type[models.Model]
    spans: type[models.Model]


def hour_cells(workflow_class: str | None, first: datetime, last: datetime) -> dict[tuple[str, str], Cell]:
    """The rolled-up attempts in the hours from ``first`` to ``last`` (both included), by class and step.

    Of ``workflow_class`` only, or of every class (None).
    """
    return _stored_cells(WorkflowStepHour.objects.filter(hour__gte=first, hour__lte=last), workflow_class)


def span_cells(workflow_class: str | None, first: datetime, last: datetime) -> dict[tuple[str, str], Cell]:
    """The rolled-up attempts in the spans starting from ``first`` to ``last`` (both included), by class and step."""
    return _stored_cells(WorkflowStepSpan.objects.filter(start__gte=first, start__lte=last), workflow_class)


def _stored_cells(
    rows: models.QuerySet[WorkflowStepHour] | models.QuerySet[WorkflowStepSpan], workflow_class: str | None
) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    if workflow_class is not None:
        rows = rows.filter(workflow_class=workflow_class)
    for row in rows.order_by():
        cells.setdefault((row.workflow_class, row.step_name), Cell()).add(stored_cell(row))
    return cells


def window_cells(workflow_class: str | None, since: datetime, now: datetime) -> dict[tuple[str, str], Cell]:
    """The attempts that finished in ``(since, now]``, by class and step (of one class, or of every class: None).

    The hours rolled up so far from ``WorkflowStepHour``, the spans between the hour and the
    span boundary nearest ``since`` from ``WorkflowStepSpan``, and from the attempts what
    finished between that boundary and ``since`` and since the rollup's end. PostgreSQL only.
    """
    return consistent(MARK, lambda reached: _window_cells(workflow_class, since, now, *reached))


def consistent(mark: str, read: Callable[[tuple[datetime | None, datetime | None]], _Read]) -> _Read:
    """``read(reach(mark))``, read again while the rollup ``mark`` moved during it (up to ``READ_TRIES`` times).

    A read's statements each see what had committed when they began: a sweep that commits its
    rows and its mark between two of them would have the attempts it added counted twice (in
    the rows, and from the attempts past the mark read first). The mark unmoved after the
    read means no such commit came between.
    """
    reached = reach(mark)
    for _ in range(READ_TRIES):
        found = read(reached)
        if (now_reached := reach(mark)) == reached:
            break
        reached = now_reached
    return found


def _window_cells(
    workflow_class: str | None, since: datetime, now: datetime, until: datetime | None, spans_from: datetime | None
) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    if until is None or not since < until <= now:
        parts = [(1, {"gt": since, "lte": now})]
    else:
        start = window_start(since, until, spans_from)
        cells = hour_cells(workflow_class, start.hour, floor_hour(until))
        if spans := start.spans():
            first, last, sign = spans
            _count(cells, span_cells(workflow_class, first, last), sign)
        rows, sign = start.rows()
        parts = sorted([(sign, rows), (1, {"gte": until, "lte": now})], key=lambda part: -part[0])
    for sign, bounds in parts:
        found: dict[tuple[str, str], Cell] = {}
        for (klass, step_name, _), cell in attempt_cells(workflow_class, **bounds).items():
            found.setdefault((klass, step_name), Cell()).add(cell)
        _count(cells, found, sign)
    return cells


def _count(cells: dict[tuple[str, str], Cell], more: dict[tuple[str, str], Cell], sign: int) -> None:
    """Add ``more`` to ``cells`` (``sign`` 1), or take it off (-1: they are among them)."""
    for key, cell in more.items():
        mine = cells.setdefault(key, Cell())
        if sign > 0:
            mine.add(cell)
        else:
            mine.remove(cell)


def rolled_until(mark: str = MARK) -> datetime | None:
    """How far the rollup ``mark`` goes: all finished (or ended) before it is counted (None before the first)."""
    return reach(mark)[0]


def reach(mark: str) -> tuple[datetime | None, datetime | None]:
    """How far the rollup ``mark`` goes, and where its spans begin (``rolled_until``, ``spans_from``), in one read."""
    found = WorkflowRollupMark.objects.filter(name=mark).values_list("rolled_until", "spans_from").first()
    return found or (None, None)


def roll_up(now: datetime, max_seconds: float = ROLLUP_SECONDS) -> int:
    """The sweep's ``rollups`` phase: roll up what settled, take the next checkpoints, drop expired rows.

    Two rollups, each with its own mark: the attempts finished (``WorkflowStepHour`` and
    ``WorkflowStepSpan``) and the runs ended (``WorkflowRunHour`` and ``WorkflowRunSpan``,
    ``run_hours.add_runs``). Returns how many rows it wrote. Spends at most ``max_seconds`` on
    each (at least one hour when any is due).
    """
    if not sql.postgresql():
        return 0
    return sum(_roll(rollup, now, max_seconds) for rollup in ROLLUPS)


def _roll(rollup: Rollup, now: datetime, max_seconds: float) -> int:
    """Move the rollup's mark up to its checkpoint if settled (an hour at a time), take the next, drop expired rows."""
    with transaction.atomic():
        mark, _ = WorkflowRollupMark.objects.select_for_update().get_or_create(name=rollup.mark)
        written = 0
        caught_up = mark.checkpoint_at is None
        if mark.checkpoint_at is not None and not _still_open(mark.checkpoint_xids):
            settled = mark.checkpoint_at
            start = mark.rolled_until or rollup.first_hour() or settled
            if mark.spans_from is None:  # the first rollup, or the first since an upgrade: spans from here on
                mark.spans_from = max(ceil_span(start), floor_span(now - SPANS_KEPT))
            deadline = time.monotonic() + max_seconds
            hours = 0
            while start < settled and (hours == 0 or time.monotonic() < deadline):
                end = min(floor_hour(start) + HOUR, settled)
                written += rollup.add(start, end, mark.spans_from)
                start = end
                hours += 1
            mark.rolled_until = max(start, mark.rolled_until or start)
            caught_up = start >= settled
        if caught_up:
            mark.checkpoint_at = now - SETTLE
            mark.checkpoint_xids = _open_here()
        _expire(rollup, mark, now)
        mark.save()
    return written


def _expire(rollup: Rollup, mark: WorkflowRollupMark, now: datetime) -> None:
    """Drop hours older than ``RETENTION`` (and an hour), and spans older than ``SPANS_KEPT`` or those hours.

    A span read at a window's start goes with its hour's row (``periods.window_start``), so no
    span outlives its hour, and ``spans_from`` moves past the spans dropped.
    """
    spans_before = floor_span(now - SPANS_KEPT)
    if settings.RETENTION is not None:
        hours_before = now - settings.RETENTION - HOUR
        rollup.hours._default_manager.filter(hour__lt=hours_before).delete()
        spans_before = max(spans_before, ceil_span(hours_before))
    if mark.spans_from is not None and mark.spans_from < spans_before:
        rollup.spans._default_manager.filter(start__lt=spans_before).delete()
        mark.spans_from = spans_before


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


def _add_range(start: datetime, end: datetime, spans_from: datetime) -> int:
    """Add the attempts finished from ``start`` up to ``end`` (within one hour) to their hour's and spans' rows."""
    by_span = attempt_cells(gte=start, lt=end)
    by_hour: dict[tuple[str, str, datetime], Cell] = {}
    for (klass, step_name, span), cell in by_span.items():
        by_hour.setdefault((klass, step_name, floor_hour(span)), Cell()).add(cell)
    spans = {key: cell for key, cell in by_span.items() if key[2] >= spans_from}
    return _write(WorkflowStepHour, "hour", by_hour) + _write(WorkflowStepSpan, "start", spans)


def _write(model: type[_Row], period: str, cells: dict[tuple[str, str, datetime], Cell]) -> int:
    """Add ``cells`` (by class, step and period's start) to ``model``'s rows; the mark's lock keeps other sweeps out."""
    if not cells:
        return 0
    for row in model._default_manager.filter(**{f"{period}__in": {moment for _, _, moment in cells}}):
        if (key := (row.workflow_class, row.step_name, getattr(row, period))) in cells:
            cells[key].add(stored_cell(row))
    model._default_manager.bulk_create(
        [
            model(workflow_class=klass, step_name=step_name, **{period: moment}, **stored_row(cell))
            for (klass, step_name, moment), cell in cells.items()
        ],
        update_conflicts=True,
        unique_fields=["workflow_class", period, "step_name"],
        update_fields=[*stored_row(Cell())],
    )
    return len(cells)


#: The two rollups, rolled in this order each sweep.
ROLLUPS = (
    Rollup(MARK, _first_hour, _add_range, WorkflowStepHour, WorkflowStepSpan),
    Rollup(RUN_MARK, first_run_end, add_runs, WorkflowRunHour, WorkflowRunSpan),
)
