"""The sweep: the dispatcher's housekeeping, run by one dispatcher at a time.

Every ``SWEEP_INTERVAL`` (phases run in this order, each on its own, so one failing phase
is logged and retried next time without stopping the others):

- ``dead_dispatchers``: a dispatcher whose heartbeat is older than ``DISPATCHER_DEAD_AFTER``
  is dead; its in-progress steps get ``STALL_ACTION`` at once (detection ``dead_dispatcher``).
- ``stalled``: an in-progress step past its ``stall_at`` (started + ``timeout=`` or
  ``STALL_THRESHOLD``) gets ``STALL_ACTION`` (detection ``stall_at``).
- ``gravestones``: a waiting run parked in a step the code replaced by ``removed_step()``
  moves on to the next step (``services.deploys``).
- ``wait_timeouts``: waiting steps of waiting runs past their ``timeout_at`` get their
  ``on_timeout`` (at most 500 x 20 per sweep), so a timeout fires within one interval.
- ``stalled_jobs``: running fan-out jobs past their ``stall_at`` are retried (or failed
  when their attempts are spent); a dead dispatcher's jobs are put back the same way.
- ``unknown_steps``: a step due for ``UNKNOWN_STEP_GRACE`` that no live dispatcher's code
  defines pauses its run with ``StepNotDefined`` recorded (``services.deploys``).
- ``stray_holds``: a scheduled attempt held (``WorkflowStep.held``) although its run is no
  longer paused (resumed by code older than the flag) is released (``services.deploys``).
- ``lost_fan_outs``: a fan-out still waiting although all its jobs ended (its dispatcher died
  between the last job's end and the resolution) is resolved as the last job would have.
- ``cleanup`` (hourly, and at every sweep while a backlog is left): finished and cancelled
  runs older than ``RETENTION`` are deleted in batches of 500, at most ten batches a sweep;
  their steps, events, signals and jobs go with them (``ON DELETE CASCADE`` in the database).
- ``gauge``: runs by class and status and by class and stuck reason, zero-filled over
  every registered class, sent as the ``workflow_gauge`` Django signal; read through
  indexes only, a count above ``GAUGE_EXACT_UP_TO`` being the planner's estimate.

Every move is re-checked under the run's lock: the step may have finished since the query.
No phase waits for a lock: a run another transaction holds (an ``atomic=True`` body, an
operator) is alive and passed over; a row that fails is logged, recorded on its run and
passed over for a while (``services.isolation``), so one bad row costs only itself. The
dispatcher runs the sweep on a thread of its own, so it never delays claims or heartbeats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Subquery

from . import clock, signals, sql
from .conf import settings
from .models import Dispatcher, FanOutJob, JobStatus, WorkflowRun, WorkflowStep
from .registry import registry
from .services.claims import stall
from .services.deploys import pause_unknown_steps, release_stray_holds, skip_parked_gravestones
from .services.fanout_recovery import ended_fan_outs, recover_jobs, resolve_lost_fan_outs
from .services.isolation import RowFailures
from .services.schedules import delete_expired_schedule_events
from .services.waiting import expire_due_waits
from .session import TransactionLock
from .sql.counting import bounded_pair_counts, distinct_values, planner_estimate
from .states import TERMINAL_RUN, RunStatus, StepStatus

logger = logging.getLogger("pgbus_workflows")

BATCH_SIZE = 500
CLEANUP_EVERY = timedelta(hours=1)
#: Retention batches one sweep deletes at most (a backlog goes on at the next sweep).
CLEANUP_BATCHES = 10
#: Advisory lock key held while a dispatcher sweeps ("pgbus" in ASCII): a transaction-level
#: lock on a connection of its own (``session.TransactionLock``), right behind PgBouncer too.
SWEEP_LOCK_KEY = 0x7067627573
STUCK_REASONS = ("stalled", "overdue", "waiting_overdue", "paused_on_error", "fan_out_unresolved")
#: Up to this many runs of one class in one status the gauge counts exactly; above, it
#: reports the planner's estimate (the dashboard says "about").
GAUGE_EXACT_UP_TO = 10_000


def stall_dead_dispatchers(now: datetime, failures: RowFailures | None = None) -> int:
    """Stall the in-progress steps of dispatchers whose heartbeat stopped; forget those dispatchers."""
    failures = failures or RowFailures()
    cutoff = now - settings.DISPATCHER_DEAD_AFTER
    dead = list(Dispatcher.objects.filter(heartbeat_at__lt=cutoff).values_list("name", flat=True))
    stalled = 0
    for name in dead:
        steps = WorkflowStep.objects.filter(status=StepStatus.IN_PROGRESS, claimed_by=name)
        rows = steps.exclude(pk__in=failures.passed_over("dead_dispatchers")).order_by("pk")
        stalled += _stall_each(rows, "dead_dispatchers", now, failures)
        stalled += recover_jobs(now, dead=[name], failures=failures)
        jobs = FanOutJob.objects.filter(status=JobStatus.RUNNING, claimed_by=name)
        if not steps.exists() and not jobs.exists():
            Dispatcher.objects.filter(name=name, heartbeat_at__lt=cutoff).delete()
            logger.warning("Dispatcher %s stopped heartbeating: forgotten", name)
    return stalled


def stall_overdue_steps(now: datetime, failures: RowFailures | None = None) -> int:
    """Stall in-progress steps past their ``stall_at``."""
    failures = failures or RowFailures()
    rows = WorkflowStep.objects.filter(status=StepStatus.IN_PROGRESS, stall_at__lt=now)
    return _stall_each(rows.exclude(pk__in=failures.passed_over("stalled")).order_by("pk"), "stalled", now, failures)


def _stall_each(steps: Any, phase: str, now: datetime, failures: RowFailures) -> int:
    """Stall each of (at most ``BATCH_SIZE`` of) ``steps``, never waiting for a locked run."""
    detection = "stall_at" if phase == "stalled" else "dead_dispatcher"
    return sum(
        failures.act(
            phase, step_pk, run_pk, partial(stall, step_pk, run_pk, detection=detection, now=now, skip_locked=True)
        )
        for step_pk, run_pk in steps.values_list("pk", "run_id")[:BATCH_SIZE]
    )


def delete_expired_runs(now: datetime, batch_size: int = BATCH_SIZE, max_batches: int | None = None) -> int:
    """Delete finished and cancelled runs older than ``RETENTION``, a batch at a time.

    Each batch is its own short transaction and skips runs another transaction holds; at most
    ``max_batches`` batches (None: until none is left), so one sweep is bounded.
    """
    retention = settings.RETENTION
    if retention is None:
        return 0
    expired = WorkflowRun.objects.filter(status__in=TERMINAL_RUN, status_changed_at__lt=now - retention)
    deleted = 0
    batches = 0
    while max_batches is None or batches < max_batches:
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


def _delete_runs(ids: list[int]) -> None:
    """Delete terminal runs; on PostgreSQL one statement, the database cascading to their rows."""
    if not sql.postgresql():
        WorkflowRun.objects.filter(pk__in=ids, status__in=TERMINAL_RUN).delete()
        return
    with sql.cursor() as cursor:
        cursor.execute(sql.statement("delete_runs"), [ids, sorted(TERMINAL_RUN)])


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
    runs = WorkflowRun.objects.all() if classes is None else WorkflowRun.objects.filter(workflow_class__in=classes)
    return {
        "stalled": runs.filter(Exists(steps.filter(status=StepStatus.IN_PROGRESS, stall_at__lt=now))),
        "overdue": runs.filter(
            Exists(steps.filter(status=StepStatus.SCHEDULED, scheduled_at__lt=now - threshold)),
            status=RunStatus.READY,
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


def stuck_counts(now: datetime, classes: Sequence[str] | None = None) -> dict[tuple[str, str], int]:
    """``{(class, reason): runs}`` for every stuck reason (``classes``: as ``stuck_querysets``)."""
    counts: dict[tuple[str, str], int] = {}
    for reason, queryset in stuck_querysets(now, classes).items():
        for klass, n in queryset.values_list("workflow_class").annotate(n=Count("pk")).order_by():
            counts[(klass, reason)] = n
    return counts


def gauge(now: datetime) -> dict[str, list[dict[str, Any]]]:
    """The gauge payload: every class x every status and every stuck reason, zero-filled.

    Read through indexes only (the class index's values one probe each, bounded counts in
    the (class, status) index, the steps' partial indexes): a count above
    ``GAUGE_EXACT_UP_TO`` is the planner's estimate.
    """
    stored = distinct_values(WorkflowRun, "workflow_class") if sql.postgresql() else None
    statuses, stuck = status_counts(stored), stuck_counts(now, stored)
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
    """Runs the sweep phases; one dispatcher at a time holds the advisory lock.

    Retention is bounded per sweep (``CLEANUP_BATCHES`` batches): it runs hourly, and at every
    sweep while a backlog is left, so a large backlog is worked off without one long sweep.
    """

    def __init__(self) -> None:
        self.last_cleanup: datetime | None = None
        self.cleanup_backlog = False
        #: The rows phases failed on, passed over for a while (``services.isolation``).
        self.failures = RowFailures()

    def phases(self, now: datetime, cleanup: bool) -> list[tuple[str, Callable[[datetime], int]]]:
        """The phases due now, in order."""
        failures = self.failures
        phases: list[tuple[str, Callable[[datetime], int]]] = [
            ("dead_dispatchers", partial(stall_dead_dispatchers, failures=failures)),
            ("stalled", partial(stall_overdue_steps, failures=failures)),
            ("stalled_jobs", partial(recover_jobs, failures=failures)),
            ("gravestones", partial(skip_parked_gravestones, failures=failures)),
            ("wait_timeouts", partial(expire_due_waits, failures=failures)),
            ("unknown_steps", partial(pause_unknown_steps, failures=failures)),
            ("stray_holds", partial(release_stray_holds, failures=failures)),
            ("lost_fan_outs", partial(resolve_lost_fan_outs, failures=failures)),
        ]
        if cleanup:
            phases.append(("cleanup", partial(delete_expired_runs, max_batches=CLEANUP_BATCHES)))
            phases.append(("schedule_events", partial(delete_expired_schedule_events, max_batches=CLEANUP_BATCHES)))
        phases.append(("gauge", emit_gauge))
        return phases

    def run(self, now: datetime | None = None, *, force_cleanup: bool = False) -> dict[str, Any] | None:
        """Run every due phase; None when another dispatcher is sweeping."""
        now = now or clock.now()
        lock = TransactionLock(SWEEP_LOCK_KEY) if sql.postgresql() else None
        if lock is not None and not lock.acquire():
            return None
        try:
            cleanup = (
                force_cleanup
                or self.cleanup_backlog
                or self.last_cleanup is None
                or now - self.last_cleanup >= CLEANUP_EVERY
            )
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
                self.cleanup_backlog = summary["cleanup"] >= CLEANUP_BATCHES * BATCH_SIZE
            if failed:
                summary["failed"] = failed
        finally:
            if lock is not None:
                lock.release()
        acted = {k: v for k, v in summary.items() if k != "gauge" and v}
        if acted:
            logger.info("Sweep: %s", ", ".join(f"{k}={v}" for k, v in acted.items()))
        signals.sweep_finished.send(sender="pgbus_workflows", summary=summary)
        return summary
