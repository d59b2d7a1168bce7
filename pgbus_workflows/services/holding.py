"""Holding a workflow class or a queue: no step of it is claimed until it is released.

For when a downstream service is down. A hold is a row (``WorkflowHold``) that every claim
reads (``sql.holding``): while it is active no dispatcher claims a step of the class (on the
queue). Nothing else changes: runs keep their status, starts and signals are accepted, waits
and timeouts come due (the step is due, it is just not claimed). Release wakes the
dispatchers, which claim the held steps in priority and due order, within their limits. A
hold stops new claims, not running bodies: a step claimed before the hold runs to its end.

On PostgreSQL a hold also parks the held steps (``sql.holding``: out of the due range the
claims read, as a full limit's held-back steps are), so a held class's backlog costs other
classes' claims nothing; the sweep parks the steps scheduled during the hold, and release puts
them all back.

Holding what is already held returns the active hold unchanged, and releasing what is not
held returns None, so a script (a circuit breaker) may call either again. The hold's row is
kept after its release: the table is the audit trail, with a log line for each.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import sql
from ..conf import settings
from ..dsl.declared import NotRegistered, registry
from ..models import HoldKind, WorkflowHold
from ..sql.holding import parked_on
from .operator import DEFAULT_ACTOR

logger = logging.getLogger("pgbus_workflows")

#: The longest class or queue name a hold stores.
MAX_NAME_LENGTH = 200


def hold_class(cls: type | str, actor: str | None = None, reason: str | None = None) -> WorkflowHold:
    """Hold a workflow class (the class or its registered ``name``): none of its steps is claimed until released.

    Returns the active hold (the one already placed, unchanged, when the class was held).
    Raises ``NotRegistered`` for a name no class is registered under.
    """
    name = class_name(cls)
    return _hold(HoldKind.CLASS, name, actor, reason)


def release_class(cls: type | str, actor: str | None = None, reason: str | None = None) -> WorkflowHold | None:
    """Release the hold of a workflow class; its due steps are claimed again. None when it was not held."""
    name = class_name(cls)
    return _release(HoldKind.CLASS, name, actor, reason, _class_queues(name))


def hold_queue(name: str, actor: str | None = None, reason: str | None = None) -> WorkflowHold:
    """Hold a queue: no step on it is claimed until released. Returns the active hold."""
    return _hold(HoldKind.QUEUE, queue_name(name), actor, reason)


def release_queue(name: str, actor: str | None = None, reason: str | None = None) -> WorkflowHold | None:
    """Release the hold of a queue; its due steps are claimed again. None when it was not held."""
    return _release(HoldKind.QUEUE, queue_name(name), actor, reason, [name])


def active_holds() -> list[WorkflowHold]:
    """The holds in force, oldest first."""
    return list(WorkflowHold.objects.active().order_by("held_at", "pk"))


def class_name(cls: type | str) -> str:
    """The registered name of a workflow class given as the class or its name; ``NotRegistered`` otherwise."""
    name = cls if isinstance(cls, str) else getattr(cls, "name", None)
    if not isinstance(name, str) or not registry.is_registered(name):
        known = ", ".join(sorted(c.name for c in registry.classes())) or "none"
        raise NotRegistered(f"No workflow class is registered as {name or cls!r} (registered: {known})")
    return name


def queue_name(name: str) -> str:
    """``name`` when it can name a queue; ``ValueError`` otherwise."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"A queue name is a non-empty string of at most {MAX_NAME_LENGTH} characters, not {name!r}")
    return name


def _class_queues(name: str) -> list[str]:
    """The queues the steps of class ``name`` go to (their dispatchers are woken on release)."""
    cls = registry.get(name)
    if cls is None:
        return []
    default = cls.step_options.get("queue") or settings.DEFAULT_QUEUE
    return sorted({definition.queue or default for definition in cls.step_definitions()})


def _hold(kind: HoldKind, name: str, actor: str | None, reason: str | None) -> WorkflowHold:
    actor = actor or DEFAULT_ACTOR
    try:
        with transaction.atomic():
            hold = WorkflowHold.objects.create(kind=kind, name=name, held_by=actor, reason=reason or "")
    except IntegrityError:  # held already (the active holds' unique index): that hold stands
        return WorkflowHold.objects.active().get(kind=kind, name=name)
    logger.warning("Workflow %s %r held by %s: %s", kind.value, name, actor, reason or "(no reason given)")
    park_held_steps()
    return hold


def _release(
    kind: HoldKind, name: str, actor: str | None, reason: str | None, queues: list[str]
) -> WorkflowHold | None:
    actor = actor or DEFAULT_ACTOR
    with transaction.atomic():
        hold = WorkflowHold.objects.active().select_for_update().filter(kind=kind, name=name).first()
        if hold is None:
            return None
        hold.released_at, hold.released_by, hold.release_reason = timezone.now(), actor, reason or ""
        hold.save(update_fields=["released_at", "released_by", "release_reason"])
    if sql.postgresql():  # released first, so the sweep parks no more of them
        _run_batches("unpark_held", [parked_on(kind, name)])
        with sql.bound_cursor() as cursor:  # the held steps are due: the dispatchers of their queues claim them now
            for queue in queues:
                cursor.execute(sql.statement("notify"), [settings.NOTIFY_CHANNEL, queue])
    logger.warning("Workflow %s %r released by %s: %s", kind.value, name, actor, reason or "(no reason given)")
    return hold


#: Steps one parking or unparking statement moves at most.
PARK_BATCH = 10_000


def park_held_steps(now: datetime | None = None) -> int:
    """Park the scheduled steps of the held classes and queues not parked yet; how many (the sweep calls it too).

    Nothing on SQLite (its claim reads the holds alone) or when nothing is held (one read of
    an empty index).
    """
    if not sql.postgresql() or not WorkflowHold.objects.active().exists():
        return 0
    return _run_batches("park_held", [])


def _run_batches(statement: str, params: list[object]) -> int:
    moved = 0
    while True:
        with transaction.atomic(), sql.bound_cursor() as cursor:
            cursor.execute(sql.statement(statement), [*params, PARK_BATCH])
            batch: int = cursor.rowcount
        moved += batch
        if batch < PARK_BATCH:
            return moved
