"""Retention: finished and cancelled runs older than ``RETENTION`` are deleted, a batch at a time.

The sweep's ``cleanup`` phase calls it (bounded per sweep); it is a service because it writes
rows, and the schedule events' own retention sits beside their writers
(``services.schedules.delete_expired_schedule_events``).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import QuerySet

from .. import sql
from ..conf import settings
from ..models import WorkflowRun
from ..states import TERMINAL_RUN

#: Runs one retention batch deletes at most, each batch its own short transaction.
BATCH_SIZE = 500


def delete_expired_runs(
    now: datetime,
    batch_size: int = BATCH_SIZE,
    max_batches: int | None = None,
    max_seconds: float | None = None,
) -> int:
    """Delete finished and cancelled runs older than ``RETENTION``, a batch at a time.

    Each batch is its own short transaction and skips runs another transaction holds; it stops
    after ``max_batches`` batches or once ``max_seconds`` have passed (at least one batch; None:
    until none is left), so one sweep is bounded.
    """
    if settings.RETENTION is None:
        return 0
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    expired = _expired(now)
    deleted = 0
    batches = 0
    while (max_batches is None or batches < max_batches) and (
        deadline is None or batches == 0 or time.monotonic() < deadline
    ):
        batches += 1
        with transaction.atomic():
            ids = list(
                expired.select_for_update(skip_locked=True).order_by("pk").values_list("pk", flat=True)[:batch_size]
            )
            if not ids:
                return deleted
            _delete_runs(ids)
        deleted += len(ids)
    return deleted


def expired_runs_left(now: datetime) -> bool:
    """Whether finished or cancelled runs older than ``RETENTION`` are still there (an index probe)."""
    return settings.RETENTION is not None and _expired(now).exists()


def _expired(now: datetime) -> QuerySet[WorkflowRun]:
    """The terminal runs older than ``RETENTION`` (which the callers know is set)."""
    retention = settings.RETENTION or timedelta(0)
    return WorkflowRun.objects.filter(status__in=TERMINAL_RUN, status_changed_at__lt=now - retention)


def _delete_runs(ids: list[int]) -> None:
    """Delete terminal runs; on PostgreSQL one statement, the database cascading to their rows."""
    if not sql.postgresql():
        WorkflowRun.objects.filter(pk__in=ids, status__in=TERMINAL_RUN).delete()
        return
    with sql.cursor() as cursor:
        cursor.execute(sql.statement("delete_runs"), [ids, sorted(TERMINAL_RUN)])
