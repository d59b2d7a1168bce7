"""The sweep: the dispatcher's housekeeping, run by one dispatcher at a time.

Every ``SWEEP_INTERVAL`` (phases run in this order, each on its own, so one failing phase
is logged and retried next time without stopping the others):

- ``dead_dispatchers``: a dispatcher whose heartbeat is older than ``DISPATCHER_DEAD_AFTER``
  is dead; its in-progress steps get ``STALL_ACTION`` at once (detection ``dead_dispatcher``).
- ``stalled``: an in-progress step past its ``stall_at`` (started + ``timeout=`` or
  ``STALL_THRESHOLD``) gets ``STALL_ACTION`` (detection ``stall_at``).
- ``wait_timeouts``: waiting steps of waiting runs past their ``timeout_at`` get their
  ``on_timeout`` (at most 500 x 20 per sweep), so a timeout fires within one interval.
- ``stalled_jobs``: running fan-out jobs past their ``stall_at`` are retried (or failed
  when their attempts are spent); a dead dispatcher's jobs are put back the same way.
- ``lost_fan_outs``: a fan-out still waiting although all its jobs ended more than
  ``STALL_THRESHOLD`` ago is resolved as the last job would have resolved it.
- ``cleanup`` (hourly): finished and cancelled runs older than ``RETENTION`` are deleted
  in batches of 500; their steps, events and signals go with them (ON DELETE CASCADE).
- ``gauge``: runs by class and status and by class and stuck reason, zero-filled over
  every registered class, sent as the ``workflow_gauge`` Django signal.

Every move is re-checked under the run's lock: the step may have finished since the query.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Subquery
from django.utils import timezone

from . import signals
from .conf import settings
from .models import Dispatcher, FanOutJob, JobStatus, WorkflowRun, WorkflowStep
from .registry import registry
from .services.fanout import recover_jobs, resolve_lost_fan_outs
from .services.ledger import locked_step
from .services.outcome import stall_step
from .services.waiting import expire_due_waits
from .states import TERMINAL_RUN, RunStatus, StepStatus

logger = logging.getLogger("pgbus_workflows")

BATCH_SIZE = 500
CLEANUP_EVERY = timedelta(hours=1)
#: ``pg_try_advisory_lock`` key held while a dispatcher sweeps ("pgbus" in ASCII).
SWEEP_LOCK_KEY = 0x7067627573
STUCK_REASONS = ("stalled", "overdue", "waiting_overdue", "paused_on_error")


def stall(step_pk: int, run_pk: int, *, detection: str, now: datetime) -> bool:
    """Stall one in-progress attempt, re-checked under the run lock; False when it moved on."""
    with locked_step(run_pk, step_pk, now=now) as (ledger, step):
        if step is None or step.status != StepStatus.IN_PROGRESS:
            return False
        if detection == "stall_at" and (step.stall_at is None or step.stall_at >= now):
            return False
        stall_step(ledger, step, detection=detection)
        return True


def stall_dead_dispatchers(now: datetime) -> int:
    """Stall the in-progress steps of dispatchers whose heartbeat stopped; forget those dispatchers."""
    cutoff = now - settings.DISPATCHER_DEAD_AFTER
    dead = list(Dispatcher.objects.filter(heartbeat_at__lt=cutoff).values_list("name", flat=True))
    stalled = 0
    for name in dead:
        steps = WorkflowStep.objects.filter(status=StepStatus.IN_PROGRESS, claimed_by=name)
        for step_pk, run_pk in steps.values_list("pk", "run_id").order_by("pk")[:BATCH_SIZE]:
            stalled += stall(step_pk, run_pk, detection="dead_dispatcher", now=now)
        stalled += recover_jobs(now, dead=[name])
        jobs = FanOutJob.objects.filter(status=JobStatus.RUNNING, claimed_by=name)
        if not steps.exists() and not jobs.exists():
            Dispatcher.objects.filter(name=name, heartbeat_at__lt=cutoff).delete()
            logger.warning("Dispatcher %s stopped heartbeating: forgotten", name)
    return stalled


def stall_overdue_steps(now: datetime) -> int:
    """Stall in-progress steps past their ``stall_at``."""
    rows = (
        WorkflowStep.objects.filter(status=StepStatus.IN_PROGRESS, stall_at__lt=now)
        .order_by("pk")
        .values_list("pk", "run_id")[:BATCH_SIZE]
    )
    return sum(stall(step_pk, run_pk, detection="stall_at", now=now) for step_pk, run_pk in rows)


def delete_expired_runs(now: datetime, batch_size: int = BATCH_SIZE) -> int:
    """Delete finished and cancelled runs older than ``RETENTION``, a batch at a time."""
    retention = settings.RETENTION
    if retention is None:
        return 0
    expired = WorkflowRun.objects.filter(status__in=TERMINAL_RUN, status_changed_at__lt=now - retention)
    deleted = 0
    while True:
        ids = list(expired.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return deleted
        with transaction.atomic():
            WorkflowRun.objects.filter(pk__in=ids, status__in=TERMINAL_RUN).delete()
        deleted += len(ids)


def status_counts() -> dict[tuple[str, str], int]:
    """``{(class, status): runs}`` over every run."""
    rows = WorkflowRun.objects.values_list("workflow_class", "status").annotate(n=Count("pk")).order_by()
    return {(klass, status): n for klass, status, n in rows}


def stuck_querysets(now: datetime) -> dict[str, Any]:
    """One queryset of runs per stuck reason (the gauge counts them; the admin filters by them)."""
    threshold = settings.STALL_THRESHOLD
    steps = WorkflowStep.objects.filter(run_id=OuterRef("pk"))
    return {
        "stalled": WorkflowRun.objects.filter(Exists(steps.filter(status=StepStatus.IN_PROGRESS, stall_at__lt=now))),
        "overdue": WorkflowRun.objects.filter(
            Exists(steps.filter(status=StepStatus.SCHEDULED, scheduled_at__lt=now - threshold)),
            status=RunStatus.READY,
        ),
        "waiting_overdue": WorkflowRun.objects.filter(
            Exists(
                steps.filter(
                    status=StepStatus.WAITING,
                    timeout_at__isnull=True,
                    waiting_since__lt=now - settings.WAITING_VISIBILITY_THRESHOLD,
                )
            ),
            status=RunStatus.WAITING,
        ),
        "paused_on_error": WorkflowRun.objects.filter(status=RunStatus.PAUSED)
        .annotate(last_step_status=Subquery(steps.order_by("-pk").values("status")[:1]))
        .filter(last_step_status=StepStatus.FAILED),
    }


def stuck_counts(now: datetime) -> dict[tuple[str, str], int]:
    """``{(class, reason): runs}`` for every stuck reason."""
    counts: dict[tuple[str, str], int] = {}
    for reason, queryset in stuck_querysets(now).items():
        for klass, n in queryset.values_list("workflow_class").annotate(n=Count("pk")).order_by():
            counts[(klass, reason)] = n
    return counts


def gauge(now: datetime) -> dict[str, list[dict[str, Any]]]:
    """The gauge payload: every class x every status and every stuck reason, zero-filled."""
    statuses, stuck = status_counts(), stuck_counts(now)
    classes = sorted({k for k, _ in statuses} | {k for k, _ in stuck} | {c.name for c in registry.classes()})
    return {
        "statuses": _zero_filled(classes, RunStatus.values, statuses, "status"),
        "stuck": _zero_filled(classes, list(STUCK_REASONS), stuck, "reason"),
    }


def _zero_filled(
    classes: list[str], values: list[str], counts: dict[tuple[str, str], int], key: str
) -> list[dict[str, Any]]:
    """Every class x every value, so a count that drops to zero is reported as zero."""
    return [{"workflow_class": k, key: v, "count": counts.get((k, v), 0)} for k in classes for v in values]


def emit_gauge(now: datetime) -> int:
    """Send the ``workflow_gauge`` signal; returns how many stuck runs it counted."""
    payload = gauge(now)
    signals.workflow_gauge.send(sender="pgbus_workflows", **payload)
    return sum(row["count"] for row in payload["stuck"])


class Sweeper:
    """Runs the sweep phases; one dispatcher at a time holds the advisory lock."""

    def __init__(self) -> None:
        self.last_cleanup: datetime | None = None

    def phases(self, now: datetime, cleanup: bool) -> list[tuple[str, Callable[[datetime], int]]]:
        """The phases due now, in order."""
        phases: list[tuple[str, Callable[[datetime], int]]] = [
            ("dead_dispatchers", stall_dead_dispatchers),
            ("stalled", stall_overdue_steps),
            ("stalled_jobs", recover_jobs),
            ("wait_timeouts", expire_due_waits),
            ("lost_fan_outs", resolve_lost_fan_outs),
        ]
        if cleanup:
            phases.append(("cleanup", delete_expired_runs))
        phases.append(("gauge", emit_gauge))
        return phases

    def run(self, now: datetime | None = None, *, force_cleanup: bool = False) -> dict[str, Any] | None:
        """Run every due phase; None when another dispatcher is sweeping."""
        now = now or timezone.now()
        if not _try_lock():
            return None
        try:
            cleanup = force_cleanup or self.last_cleanup is None or now - self.last_cleanup >= CLEANUP_EVERY
            summary: dict[str, Any] = {}
            failed = []
            for name, phase in self.phases(now, cleanup):
                try:
                    summary[name] = phase(now)
                except Exception:
                    logger.exception("Sweep phase %s failed; it runs again next sweep", name)
                    failed.append(name)
            if cleanup and "cleanup" not in failed:
                self.last_cleanup = now
            if failed:
                summary["failed"] = failed
        finally:
            _unlock()
        acted = {k: v for k, v in summary.items() if k != "gauge" and v}
        if acted:
            logger.info("Sweep: %s", ", ".join(f"{k}={v}" for k, v in acted.items()))
        signals.sweep_finished.send(sender="pgbus_workflows", summary=summary)
        return summary


def _try_lock() -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [SWEEP_LOCK_KEY])
        row = cursor.fetchone()
    return bool(row and row[0])


def _unlock() -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [SWEEP_LOCK_KEY])
