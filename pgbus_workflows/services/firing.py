"""Firing a schedule's ticks: each due tick starts exactly one run, under the schedule's row lock.

One transaction per tick: lock the schedule row, decide with its policies what the tick does
(start a run, skip it because the last run is still going, drop missed ticks), start the run
through ``services.start`` (validation, the ``started`` event and its NOTIFY as for any
start), and move ``next_fire_at`` on. The run and the schedule's new ``next_fire_at`` commit
together, so a crash between the two cannot happen. Correctness does not rest on there being
one leader: the row lock serializes firers, and the database refuses a second run for one
tick (``pgbus_wf_one_run_per_tick``) whoever inserts it.

Catch-up (ticks whose time passed while nothing fired them, as after downtime):
``"latest"`` fires only the newest of them, ``"all"`` fires each, oldest first (at most
:data:`MAX_TICKS_PER_ROUND` per schedule per call, so one backlog never starves the others),
``"none"`` fires none of them, nor a tick more than :data:`ON_TIME` late. Dropped ticks are
recorded as a ``ticks_missed`` schedule event.

Overlap (the schedule's previous run still ongoing when a tick fires): ``"skip"`` records a
``tick_skipped`` event and starts nothing, ``"allow"`` starts the run anyway,
``"cancel_previous"`` cancels the ongoing runs (operator ``cancel``, actor ``scheduler``) first.
Firing never waits for a run's lock: when another transaction holds a previous run (an
``atomic=True`` body, an operator), the tick is left due and fired at a later round, so one
busy run never holds up the other schedules.

A tick that fails (its run cannot start) is recorded on the schedule (``last_error``, a
``tick_failed`` event, the ``schedule_failed`` signal) and passed; the other schedules fire on.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Min

from .. import signals
from ..dsl.declared import registry
from ..dsl.schedules import jitter_offset, latest_tick, next_tick
from ..models import ScheduleEvent, WorkflowRun, WorkflowSchedule
from ..sql import clock
from ..states import ScheduleEventKind
from . import operator
from .handle import handle_class
from .payload import storable_text
from .start import start_run

if TYPE_CHECKING:
    from .handle import RunHandle

logger = logging.getLogger("pgbus_workflows")

#: The actor of what a schedule does on its own (its runs' ``started`` events, cancellations).
ACTOR = "scheduler"
#: With ``catchup="none"``, a tick fired later than this after its time is dropped as missed.
ON_TIME = timedelta(seconds=60)
#: Ticks one schedule fires per :func:`fire_due` call (``catchup="all"`` after a long downtime).
MAX_TICKS_PER_ROUND = 100
DB_ERRORS = (OperationalError, InterfaceError)
#: Schedules one :func:`fire_due` call looks at.
BATCH_SIZE = 500
#: How soon a schedule whose next tick cannot even be computed (a row written by hand) is tried again.
RETRY_AFTER = timedelta(seconds=60)


#: The columns a fired tick changes (besides the next tick's).
_FIRED = ["last_fired_at", "last_run", "last_error", "last_error_at", "updated_at"]


class RunBusy(Exception):
    """``cancel_previous``: another transaction holds a previous run, so the tick cannot cancel it now."""


def due_schedules(now: datetime) -> Any:
    """Schedules that fire on their own, whose class this process knows, with a tick due by ``now``."""
    known = [cls.name for cls in registry.classes()]
    return WorkflowSchedule.objects.filter(enabled=True, paused=False, due_at__lte=now, workflow_class__in=known)


def next_due_at() -> datetime | None:
    """When the next tick of a schedule this process can fire is due (None: no schedule fires)."""
    known = [cls.name for cls in registry.classes()]
    return WorkflowSchedule.objects.filter(enabled=True, paused=False, workflow_class__in=known).aggregate(  # type: ignore[no-any-return]
        at=Min("due_at")
    )["at"]


def fire_due(now: datetime | None = None) -> list[RunHandle]:
    """Fire every tick due as of ``now`` (default: the database's clock); returns the handles started.

    A schedule another transaction holds (an operator pausing it) is passed over until the next call.
    """
    now = now or clock.now()
    started: list[RunHandle] = []
    pks = list(due_schedules(now).order_by("due_at", "pk").values_list("pk", flat=True)[:BATCH_SIZE])
    for pk in pks:
        started.extend(fire_schedule(pk, now))
    return started


def fire_schedule(pk: int, now: datetime) -> list[RunHandle]:
    """Fire the due ticks of schedule ``pk`` (its policies decide which), one transaction each."""
    started: list[RunHandle] = []
    for _ in range(MAX_TICKS_PER_ROUND):
        try:
            with transaction.atomic():
                schedule = _lock_due(pk, now)
                if schedule is None:
                    break
                handle = _fire(schedule, now)
        except DB_ERRORS:
            raise  # the database is away: the tick is still due, and fires when it is back
        except RunBusy as busy:  # rolled back: the tick stays due and fires at a later round
            logger.debug("Schedule %s: %s; firing its tick later", pk, busy)  # every round until it is free
            break
        except Exception as error:
            _record_failure(pk, now, error)
            break
        if handle is not None:
            started.append(handle)
        if schedule.due_at is None or schedule.due_at > now:
            break  # the usual case: one tick was due (no second look under a lock)
    return started


def _lock_due(pk: int, now: datetime) -> WorkflowSchedule | None:
    """The schedule, locked, if it still has a tick due (another firer may have fired it meanwhile)."""
    due = WorkflowSchedule.objects.select_for_update(skip_locked=True)
    return due.filter(pk=pk, enabled=True, paused=False, due_at__lte=now).first()


def _fire(schedule: WorkflowSchedule, now: datetime) -> RunHandle | None:
    """What the schedule's next tick does, under its lock; returns the handle of the run it started."""
    tick = schedule.next_fire_at
    if tick is None:  # a row written by hand with a due_at only: start from now
        advance(schedule, next_tick(schedule.cron, schedule.every, schedule.timezone, now))
        return None
    handle = None
    if schedule.catchup in ("latest", "none"):
        latest = latest_tick(schedule.cron, schedule.every, schedule.timezone, now)
        if latest > tick:
            _event(schedule, ScheduleEventKind.TICKS_MISSED, first=tick, last=_previous(schedule, latest))
            tick = latest
    late = now - (tick + jitter_offset(schedule.jitter, _jitter_key(schedule), tick))
    if schedule.catchup == "none" and late > ON_TIME:
        _event(schedule, ScheduleEventKind.TICKS_MISSED, first=tick, last=tick)
    else:
        handle = _start_for_tick(schedule, tick, ACTOR, None)
    advance(schedule, next_tick(schedule.cron, schedule.every, schedule.timezone, tick))
    return handle


def _previous(schedule: WorkflowSchedule, tick: datetime) -> datetime:
    """The tick before ``tick``."""
    return latest_tick(schedule.cron, schedule.every, schedule.timezone, tick - timedelta(microseconds=1))


def _start_for_tick(schedule: WorkflowSchedule, tick: datetime, actor: str, reason: str | None) -> RunHandle | None:
    """Start the tick's run as the overlap policy allows (None: skipped, or the tick already has its run).

    ``cancel_previous`` cancels the ongoing runs as ``actor`` with ``reason`` (default: the
    tick's); :class:`RunBusy` when another transaction holds one of them (nothing waits).
    """
    cls = handle_class(schedule.workflow_class)
    ongoing = []
    if schedule.overlap != "allow":
        ongoing = list(WorkflowRun.objects.ongoing().filter(schedule_id=schedule.pk).order_by("pk"))
    if ongoing and schedule.overlap == "skip":
        runs = [str(run.workflow_id) for run in ongoing]
        _event(schedule, ScheduleEventKind.TICK_SKIPPED, run=ongoing[-1], scheduled_for=tick, ongoing=runs)
        return None
    if ongoing and schedule.overlap == "cancel_previous":
        reason = reason or f"schedule {schedule.name!r}: its tick of {tick.isoformat()} cancels the previous run"
        _lock_without_waiting(ongoing)
        for run in ongoing:
            operator.cancel(run.pk, actor=actor, reason=reason)
            _event(schedule, ScheduleEventKind.PREVIOUS_CANCELLED, run=run, actor=actor, scheduled_for=tick)
    handle = start_run(
        cls,
        None,
        idempotency_key=tick_key(schedule, tick),
        arguments=dict(schedule.arguments),
        actor=actor,
        tick=(schedule.pk, tick),
    )
    if handle.duplicate_start:  # the database already holds this tick's run: nothing new started
        return None
    schedule.last_fired_at = tick
    schedule.last_run = handle.record
    schedule.last_error, schedule.last_error_at = "", None  # it works again
    return handle


def _lock_without_waiting(runs: list[WorkflowRun]) -> None:
    """Lock ``runs`` (in key order) for their cancellation, or raise :class:`RunBusy` if one is held.

    The run lock is the one ``operator.cancel`` then takes again, in this same transaction.
    """
    pks = sorted(run.pk for run in runs)
    free = WorkflowRun.objects.select_for_update(skip_locked=True).filter(pk__in=pks)
    locked = set(free.values_list("pk", flat=True))
    held = [run for run in runs if run.pk not in locked and WorkflowRun.objects.filter(pk=run.pk).exists()]
    if held:
        raise RunBusy(f"its previous run {held[0].workflow_id} is held by another transaction")


def start_now(schedule: WorkflowSchedule, actor: str, reason: str | None = None) -> RunHandle | None:
    """Start a run of the locked ``schedule`` for this moment, as ``fire now`` does (None: skipped).

    With ``cancel_previous``, ``actor`` cancels the ongoing runs with ``reason``.
    """
    handle = _start_for_tick(schedule, clock.now(), actor, reason)
    schedule.updated_at = clock.now()
    schedule.save(update_fields=_FIRED)
    return handle


def tick_key(schedule: WorkflowSchedule, tick: datetime) -> str:
    """The idempotency key of a tick's run: a second start for the tick returns the first run."""
    return f"schedule:{schedule.pk}:{tick.isoformat()}"


def _jitter_key(schedule: WorkflowSchedule) -> str:
    return f"{schedule.workflow_class}:{schedule.name}"


def advance(schedule: WorkflowSchedule, tick: datetime) -> None:
    """Make ``tick`` the schedule's next one (its due time with the jitter) and save the row."""
    schedule.next_fire_at = tick
    schedule.due_at = tick + jitter_offset(schedule.jitter, _jitter_key(schedule), tick)
    schedule.updated_at = clock.now()
    schedule.save(update_fields=[*_FIRED, "next_fire_at", "due_at"])


def _event(
    schedule: WorkflowSchedule,
    kind: str,
    run: WorkflowRun | None = None,
    actor: str = ACTOR,
    **details: datetime | Any,
) -> None:
    values = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in details.items()}
    ScheduleEvent.objects.create(schedule=schedule, kind=kind, actor=actor, run=run, details=values)


def _record_failure(pk: int, now: datetime, error: Exception) -> None:
    """A tick whose run could not start: recorded on the schedule and passed, so it does not fail forever.

    The schedule's ``last_error`` says why (the admin shows it) until a tick starts its run.
    Without the schedule's lock at once (another firer, an operator) the tick stays due.
    """
    logger.error("Schedule %s: its tick could not fire (%s: %s)", pk, type(error).__name__, error, exc_info=True)
    message = storable_text(f"{type(error).__name__}: {error}")[:2000]
    with transaction.atomic():
        schedule = WorkflowSchedule.objects.select_for_update(skip_locked=True).filter(pk=pk).first()
        if schedule is None or schedule.next_fire_at is None:
            return
        tick = schedule.next_fire_at
        ScheduleEvent.objects.create(
            schedule=schedule,
            kind=ScheduleEventKind.TICK_FAILED,
            actor=ACTOR,
            reason=message,
            details={"scheduled_for": tick.isoformat()},
        )
        schedule.last_error, schedule.last_error_at = message, now
        try:
            advance(schedule, next_tick(schedule.cron, schedule.every, schedule.timezone, max(tick, now)))
        except Exception:  # an expression the row holds cannot give a next tick: look again later
            schedule.due_at = now + RETRY_AFTER
            schedule.save(update_fields=["due_at", "last_error", "last_error_at"])
    transaction.on_commit(
        lambda: signals.schedule_failed.send(
            sender=schedule.workflow_class, schedule=schedule.name, error_class=type(error).__name__
        )
    )
