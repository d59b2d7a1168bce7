"""Schedule rows: synced from the classes' ``schedules``, added at run time, and the operator verbs.

The verbs (``pause``, ``resume``, ``fire_now``) lock the schedule row, ask
:func:`states.allowed_schedule_verbs` whether the schedule admits the verb, write a
``ScheduleEvent`` with the ``actor`` and ``reason``, and return the row. The admin calls them,
as user code does.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, InterfaceError, OperationalError, transaction

from ..conf import settings
from ..dsl.declared import DeclaredWorkflow, registry
from ..dsl.schedules import Schedule, declared_schedules, next_tick
from ..exceptions import ConfigurationError, InvalidTransition
from ..models import ScheduleEvent, WorkflowSchedule
from ..sql import clock
from ..states import ScheduleEventKind, allowed_schedule_verbs
from .firing import RunBusy, advance, start_now
from .payload import encode_payload, storable_text

if TYPE_CHECKING:
    from .handle import RunHandle

logger = logging.getLogger("pgbus_workflows")

DEFAULT_ACTOR = "api"
DB_ERRORS = (OperationalError, InterfaceError)
#: The columns a declaration sets, and those whose change moves the next tick: re-enabling
#: (``enabled`` False to True) counts from now too, so the disabled period is not caught up.
_TIMING = ("cron", "every", "timezone", "jitter", "enabled")


def _first_tick(schedule: WorkflowSchedule, after: datetime) -> None:
    """Set the schedule's first tick after ``after`` (not saved)."""
    schedule.next_fire_at = next_tick(schedule.cron, schedule.every, schedule.timezone, after)
    schedule.due_at = schedule.next_fire_at  # advance() adds the jitter when it saves


def _check_arguments(cls: type[DeclaredWorkflow], schedule: Schedule) -> None:
    encode_payload(schedule.arguments or {}, f"{cls.name} schedule {schedule.name!r} arguments")


def add_schedule(
    cls: type[DeclaredWorkflow],
    schedule: Schedule,
    *,
    start_at: datetime | None = None,
    actor: str | None = None,
) -> WorkflowSchedule:
    """Store ``schedule`` for ``cls`` as a row added at run time; its first tick is the first after ``start_at``.

    ``start_at`` defaults to now; one in the past, with ``catchup="all"``, fires the ticks
    since then (a backfill). A name the class already has raises ``ValueError``.
    """
    if cls.__dict__.get("abstract", False):
        raise ConfigurationError(f"{cls.__qualname__} is abstract: schedule one of its subclasses")
    if start_at is not None and (not isinstance(start_at, datetime) or start_at.tzinfo is None):
        raise ValueError(f"start_at must be an aware datetime, got {start_at!r}")
    _check_arguments(cls, schedule)
    now = clock.now()
    row = WorkflowSchedule(workflow_class=cls.name, name=schedule.name, declared=False, created_at=now, updated_at=now)
    for key, value in schedule.row_values().items():
        setattr(row, key, value)
    _first_tick(row, start_at or now)
    try:
        with transaction.atomic():
            row.save()
            advance(row, row.next_fire_at)  # type: ignore[arg-type]
            _event(row, ScheduleEventKind.CREATED, actor or DEFAULT_ACTOR, details={"expression": row.expression})
    except IntegrityError:
        raise ValueError(
            f"{cls.name} already has a schedule named {schedule.name!r}: pass another name= (or delete that one)"
        ) from None
    return row


def sync_declared(now: datetime | None = None) -> dict[str, int]:
    """Make the rows match the registered classes' ``schedules``; returns counts by what was done.

    A new declaration gets a row whose first tick is the first after ``now``; a changed one is
    updated (a changed expression, time zone or jitter moves its next tick to the first after
    ``now``); a row declared by a registered class that no longer declares it is deleted (its
    runs keep their ``scheduled_for``). Rows of classes this process does not know are left
    alone: another deploy's code may declare them. Operator state (``paused``) is kept.
    A declaration that cannot be stored is logged, recorded on its row when it has one
    (``last_error``), and counted as ``failed``: the other schedules sync (and fire) on.
    """
    now = now or clock.now()
    counts = {"created": 0, "changed": 0, "deleted": 0, "failed": 0, "unchanged": 0}
    rows = {(r.workflow_class, r.name): r for r in WorkflowSchedule.objects.filter(declared=True)}
    for cls in registry.classes():
        try:
            declared = declared_schedules(cls)
        except ConfigurationError as error:  # changed since the class was defined: its rows stay as they are
            kept = [rows.pop(key) for key in [key for key in rows if key[0] == cls.name]]
            _sync_failed(cls, None, kept, now, error)
            counts["failed"] += 1
            continue
        for schedule in declared:
            row = rows.pop((cls.name, schedule.name), None)
            try:
                counts[_sync_one(cls, schedule, row, now)] += 1
            except DB_ERRORS:
                raise  # the database is away: the next leader round syncs again
            except Exception as error:
                _sync_failed(cls, schedule, [row] if row else [], now, error)
                counts["failed"] += 1
    known = {cls.name for cls in registry.classes()}
    for (klass, name), row in rows.items():
        if klass in known:
            logger.info("Schedule %r of %s is no longer declared: deleted", name, klass)
            row.delete()
            counts["deleted"] += 1
    counts.pop("unchanged", None)
    return counts


def _sync_one(cls: type[DeclaredWorkflow], schedule: Schedule, row: WorkflowSchedule | None, now: datetime) -> str:
    _check_arguments(cls, schedule)  # what JSON alone allows and the database refuses (a NUL, the size)
    values = schedule.row_values()
    if row is None:
        row = WorkflowSchedule(workflow_class=cls.name, name=schedule.name, declared=True, created_at=now, **values)
        _first_tick(row, now)
        try:
            with transaction.atomic():
                row.save()
                advance(row, row.next_fire_at)  # type: ignore[arg-type]
                _event(row, ScheduleEventKind.CREATED, "code", details={"expression": row.expression})
        except IntegrityError:
            logger.warning(
                "Schedule %r declared by %s has the name of a schedule added at run time (or synced meanwhile): "
                "the row stays as it is; rename one of them",
                schedule.name,
                cls.name,
            )
            return "unchanged"
        return "created"
    changed = {key: value for key, value in values.items() if getattr(row, key) != value}
    if not changed:
        return "unchanged"
    with transaction.atomic():
        locked = WorkflowSchedule.objects.select_for_update().get(pk=row.pk)
        for key, value in changed.items():
            setattr(locked, key, value)
        if set(changed) & set(_TIMING):
            _first_tick(locked, now)
        advance(locked, locked.next_fire_at)  # type: ignore[arg-type]
        locked.save(update_fields=list(changed))
        _event(locked, ScheduleEventKind.CHANGED, "code", details={"changed": sorted(changed)})
    return "changed"


def _sync_failed(
    cls: type[DeclaredWorkflow],
    schedule: Schedule | None,
    rows: list[WorkflowSchedule],
    now: datetime,
    error: Exception,
) -> None:
    """A declaration (or a class's ``schedules``) the sync could not store: logged, and said on its rows."""
    what = f"Schedule {schedule.name!r} declared by {cls.name}" if schedule else f"The schedules of {cls.name}"
    logger.error("%s could not be synced: %s", what, error, exc_info=True)
    message = storable_text(f"{type(error).__name__}: {error}")[:2000]
    WorkflowSchedule.objects.filter(pk__in=[row.pk for row in rows]).update(last_error=message, last_error_at=now)


def pause(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowSchedule:
    """Stop the schedule's ticks until resumed (a running run goes on)."""
    with transaction.atomic():
        schedule = _admit(pk, "pause")
        schedule.paused = True
        schedule.updated_at = clock.now()
        schedule.save(update_fields=["paused", "updated_at"])
        _event(schedule, ScheduleEventKind.PAUSED, actor or DEFAULT_ACTOR, reason)
    return schedule


def resume(pk: int, *, actor: str | None = None, reason: str | None = None) -> WorkflowSchedule:
    """Resume a paused schedule: its next tick is the first after now (ticks while paused are not caught up)."""
    with transaction.atomic():
        schedule = _admit(pk, "resume")
        schedule.paused = False
        _first_tick(schedule, clock.now())
        schedule.save(update_fields=["paused"])
        advance(schedule, schedule.next_fire_at)  # type: ignore[arg-type]
        _event(schedule, ScheduleEventKind.RESUMED, actor or DEFAULT_ACTOR, reason)
    return schedule


def fire_now(pk: int, *, actor: str | None = None, reason: str | None = None) -> RunHandle:
    """Start a run of the schedule now (``scheduled_for`` = now), as its overlap policy allows.

    Its next tick stays as it was. With ``overlap="skip"`` and a run still ongoing, raises
    :class:`InvalidTransition` and starts nothing. With ``overlap="cancel_previous"`` the
    ongoing runs are cancelled by ``actor`` with ``reason``; :class:`InvalidTransition` when
    another transaction holds one of them (nothing waits for it).
    """
    with transaction.atomic():
        schedule = _admit(pk, "fire_now")
        try:
            handle = start_now(schedule, actor or DEFAULT_ACTOR, reason)
        except RunBusy as busy:
            raise InvalidTransition(f"Cannot fire {schedule} now: {busy}; try again in a moment") from None
        if handle is None:
            last = schedule.runs.order_by("-pk").first()
            raise InvalidTransition(
                f"Cannot fire {schedule}: its run {last.workflow_id if last else ''} is still ongoing and its "
                "overlap is 'skip' (wait for it, or cancel it)"
            )
        _event(schedule, ScheduleEventKind.FIRED_NOW, actor or DEFAULT_ACTOR, reason, run=handle.record)
    return handle


def delete_expired_schedule_events(now: datetime, batch_size: int = 500, max_batches: int | None = None) -> int:
    """Delete schedule events older than ``RETENTION`` (the sweep's ``schedule_events`` phase), oldest first.

    Each batch of ``batch_size`` is its own short transaction; at most ``max_batches`` batches
    (None: until none is left), so one sweep is bounded. Returns how many were deleted.
    """
    retention = settings.RETENTION
    if retention is None:
        return 0
    expired = ScheduleEvent.objects.filter(created_at__lt=now - retention).order_by("created_at", "pk")
    deleted = batches = 0
    while max_batches is None or batches < max_batches:
        batches += 1
        with transaction.atomic():
            ids = list(expired.values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            ScheduleEvent.objects.filter(pk__in=ids).delete()
        deleted += len(ids)
    return deleted


def verbs(schedule: WorkflowSchedule) -> frozenset[str]:
    """The verbs the schedule's state allows (``states.allowed_schedule_verbs``)."""
    return allowed_schedule_verbs(
        paused=schedule.paused, enabled=schedule.enabled, class_known=registry.is_registered(schedule.workflow_class)
    )


def _admit(pk: int, verb: str) -> WorkflowSchedule:
    """The schedule, locked, if its state admits ``verb``; else :class:`InvalidTransition` saying why."""
    schedule = WorkflowSchedule.objects.select_for_update().filter(pk=pk).first()
    if schedule is None:
        raise WorkflowSchedule.DoesNotExist(f"No workflow schedule with pk {pk}")
    if verb not in verbs(schedule):
        if verb == "fire_now":
            why = f"its class {schedule.workflow_class!r} is not registered"
        elif verb == "pause" and not schedule.enabled:
            why = "it is disabled in code (enabled=False): it fires only by hand"
        else:
            why = "it is already paused" if verb == "pause" else "it is not paused"
        raise InvalidTransition(f"Cannot {verb.replace('_', ' ')} schedule {schedule}: {why}")
    return schedule


def _event(
    schedule: WorkflowSchedule, kind: str, actor: str, reason: str | None = None, **fields: Any
) -> ScheduleEvent:
    return ScheduleEvent.objects.create(schedule=schedule, kind=kind, actor=actor, reason=reason or "", **fields)
