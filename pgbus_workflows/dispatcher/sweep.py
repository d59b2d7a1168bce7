"""The sweep: the dispatcher's housekeeping, run by one dispatcher at a time.

Every ``SWEEP_INTERVAL`` (phases run in this order, each on its own, so one failing phase
is logged and retried next time without stopping the others):

- ``dead_dispatchers``: a dispatcher whose heartbeat is older than ``DISPATCHER_DEAD_AFTER``
  is dead, and so is one whose LISTEN session is gone with its heartbeat two intervals old
  (:func:`lost_sessions`: a killed process, told within seconds; the heartbeat thread then
  runs the sweep at once); its in-progress steps get ``STALL_ACTION`` (detection
  ``dead_dispatcher``).
- ``stalled``: an in-progress step past its ``stall_at`` (started + ``timeout=`` or
  ``STALL_THRESHOLD``) gets ``STALL_ACTION`` (detection ``stall_at``).
- ``cancelled_slots``: a cancelled attempt that kept its concurrency slots for its running
  body gives them back once it is stalled: past its ``stall_at``, or its dispatcher gone
  (``services.slot_sweep``).
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
- ``held_steps``: while a class or a queue is held, its steps scheduled since the hold are
  parked like those it held at once (``services.holding``), so no claim walks them.
- ``lost_fan_outs``: a fan-out still waiting although all its jobs ended (its dispatcher died
  between the last job's end and the resolution) is resolved as the last job would have.
- ``limiter_slots``: each concurrency limiter's ``in_use`` is set to the attempts really
  holding one of its slots, its row locked first (rows deleted outside the library leak
  slots); each repair is a warning in the log and the limiter's ``repaired_at``.
- ``cleanup`` (hourly, and at every sweep while a backlog is left): finished and cancelled
  runs older than ``RETENTION`` are deleted in batches of 500, for at most five seconds a sweep;
  their steps, events, signals and jobs go with them (``ON DELETE CASCADE`` in the database).
- ``rollups``: the attempts finished up to a settled checkpoint (no transaction that could
  still commit one before it is open) are added to their class's, step's, hour's and
  five-minute span's counts for insights (``services.rollups``), for at most five seconds a
  sweep, and the runs ended to the funnel's; hours older than ``RETENTION`` go, spans after
  seven days and an hour.
- ``gauge``: runs by class and status and by class and stuck reason, zero-filled over
  every registered class, sent as the ``workflow_gauge`` Django signal (the read model is
  ``services.stuck``; retention's deletes are ``services.retention``).

Every move is re-checked under the run's lock: the step may have finished since the query.
No phase waits for a lock: a run another transaction holds (an ``atomic=True`` body, an
operator) is alive and passed over; a row that fails is logged, recorded on its run and
passed over for a while (``services.isolation``), so one bad row costs only itself. The
dispatcher runs the sweep on a thread of its own, so it never delays claims or heartbeats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from .. import signals, sql
from ..conf import settings
from ..models import Dispatcher, FanOutJob, JobStatus, WorkflowStep
from ..services.claims import stall
from ..services.deploys import pause_unknown_steps, release_stray_holds, skip_parked_gravestones
from ..services.fanout_recovery import recover_jobs, resolve_lost_fan_outs
from ..services.holding import park_held_steps
from ..services.isolation import RowFailures
from ..services.retention import delete_expired_runs, expired_runs_left
from ..services.rollups import roll_up
from ..services.schedules import delete_expired_schedule_events
from ..services.slot_sweep import give_back_stalled, reconcile
from ..services.stuck import gauge
from ..services.timeouts import expire_due_waits
from ..sql import clock
from ..sql.session import TransactionLock, liveness_lock_free
from ..states import StepStatus

logger = logging.getLogger("pgbus_workflows")

#: Steps one stall phase moves at most per sweep.
BATCH_SIZE = 500
CLEANUP_EVERY = timedelta(hours=1)
#: Retention batches of schedule events one sweep deletes at most (a backlog goes on at the next sweep).
CLEANUP_BATCHES = 10
#: Seconds one sweep spends deleting expired runs at most (a backlog goes on at the next sweep): a
#: bound in time, not in runs, so that deletes keep up with any rate of finished runs that the
#: server can delete (at 500 runs a batch, ten batches a sweep capped them at 83 runs/s).
CLEANUP_SECONDS = 5.0
#: Advisory lock key held while a dispatcher sweeps ("pgbus" in ASCII): a transaction-level
#: lock on a connection of its own (``session.TransactionLock``), right behind PgBouncer too.
SWEEP_LOCK_KEY = 0x7067627573


def session_grace() -> timedelta:
    """How stale the heartbeat of a dispatcher whose session is gone must be before it counts as dead.

    Two heartbeats: a LISTEN connection that reconnects lets its lock go for a moment, while
    its process, alive, goes on heartbeating (never longer than ``DISPATCHER_DEAD_AFTER``).
    """
    return min(2 * settings.HEARTBEAT_INTERVAL, settings.DISPATCHER_DEAD_AFTER)


def lost_sessions(now: datetime) -> list[str]:
    """Dispatchers whose LISTEN session is gone (its liveness lock free) and heartbeat a little stale.

    A killed process's connections are closed by its kernel, so the server frees the lock at
    once; a machine lost without a word keeps the session open until TCP gives up, and is
    told by its heartbeat's age alone (``DISPATCHER_DEAD_AFTER``).
    """
    if not sql.postgresql():
        return []
    recently = now - session_grace()
    silent = Dispatcher.objects.filter(session_lock=True, heartbeat_at__lt=recently).order_by("name")
    return [name for name in silent.values_list("name", flat=True) if liveness_lock_free(name)]


def stall_dead_dispatchers(now: datetime, failures: RowFailures | None = None) -> int:
    """Stall the in-progress steps of dispatchers that are gone; forget those dispatchers.

    Gone: the heartbeat is older than ``DISPATCHER_DEAD_AFTER``, or the LISTEN session is gone
    and the heartbeat a little stale (:func:`lost_sessions`).
    """
    failures = failures or RowFailures()
    cutoff = now - settings.DISPATCHER_DEAD_AFTER
    silent = set(Dispatcher.objects.filter(heartbeat_at__lt=cutoff).values_list("name", flat=True))
    dead = dict.fromkeys(silent, cutoff) | {name: now - session_grace() for name in lost_sessions(now)}
    stalled = 0
    for name, since in sorted(dead.items()):
        steps = WorkflowStep.objects.filter(status=StepStatus.IN_PROGRESS, claimed_by=name)
        rows = steps.exclude(pk__in=failures.passed_over("dead_dispatchers")).order_by("pk")
        stalled += _stall_each(rows, "dead_dispatchers", now, failures)
        stalled += recover_jobs(now, dead=[name], failures=failures)
        jobs = FanOutJob.objects.filter(status=JobStatus.RUNNING, claimed_by=name)
        if not steps.exists() and not jobs.exists():
            Dispatcher.objects.filter(name=name, heartbeat_at__lt=since).delete()
            logger.warning("Dispatcher %s is gone: forgotten", name)
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


def emit_gauge(now: datetime) -> int:
    """Send the ``workflow_gauge`` signal; returns how many stuck runs it counted."""
    payload = gauge(now)
    signals.workflow_gauge.send(sender="pgbus_workflows", **payload)
    return sum(row["count"] for row in payload["stuck"])


class Sweeper:
    """Runs the sweep phases; one dispatcher at a time holds the advisory lock.

    Retention is bounded per sweep (``CLEANUP_SECONDS``): it runs hourly, and at every sweep
    while a backlog is left, so a large backlog is worked off without one long sweep.
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
            ("cancelled_slots", partial(give_back_stalled, failures=failures)),
            ("stalled_jobs", partial(recover_jobs, failures=failures)),
            ("gravestones", partial(skip_parked_gravestones, failures=failures)),
            ("wait_timeouts", partial(expire_due_waits, failures=failures)),
            ("unknown_steps", partial(pause_unknown_steps, failures=failures)),
            ("stray_holds", partial(release_stray_holds, failures=failures)),
            ("held_steps", park_held_steps),
            ("lost_fan_outs", partial(resolve_lost_fan_outs, failures=failures)),
            ("limiter_slots", reconcile),
        ]
        if cleanup:
            phases.append(("cleanup", partial(delete_expired_runs, max_seconds=CLEANUP_SECONDS)))
            phases.append(("schedule_events", partial(delete_expired_schedule_events, max_batches=CLEANUP_BATCHES)))
        phases.append(("rollups", roll_up))
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
                self.cleanup_backlog = expired_runs_left(now)
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
