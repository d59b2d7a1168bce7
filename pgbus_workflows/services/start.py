"""Starting a run: the run row, its first step and a ``started`` event, in one transaction."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import IntegrityError, OperationalError, ProgrammingError, transaction
from django.db.models import Model

from .. import signals, sql, tracing
from ..conf import settings
from ..dsl.debounce import Debounce
from ..dsl.declared import registry
from ..dsl.definitions import StepDefinition, resolve_wait
from ..exceptions import ConfigurationError
from ..migrated import explain
from ..models import WorkflowRun
from ..sql import bulk, clock, rows
from ..states import RunStatus
from . import fairness
from .debounce import collapse, debounced_key, lock_key, start_of_key
from .duplicates import conflict, same_start
from .ledger import RunLedger
from .limiting import bind_copy
from .payload import encode_payload, subject_reference

logger = logging.getLogger("pgbus_workflows")

#: Longest idempotency key or signal name a row holds.
MAX_KEY_LENGTH = 255

if TYPE_CHECKING:
    from .handle import RunHandle

#: A workflow class's handle: what ``start_run(cls, ...)`` returns is an instance of ``cls``.
H = TypeVar("H", bound="RunHandle")

#: ``(schedule pk, the tick's time)`` of a run a schedule starts.
Tick = tuple[int, datetime]
#: ``(actor, reason)`` of a start, recorded on its ``started`` event.
Audit = tuple[str | None, str | None]


def start_run(
    cls: type[H],
    subject: Model | None,
    *,
    idempotency_key: str | None = None,
    arguments: dict[str, Any] | None = None,
    actor: str | None = None,
    rerun_of: WorkflowRun | None = None,
    tick: Tick | None = None,
    delay: timedelta | None = None,
    reason: str | None = None,
) -> H:
    """Create a run of ``cls`` and schedule its first step; returns the handle.

    Works inside the caller's ``transaction.atomic()`` (the dispatcher sees nothing until it
    commits). Bad input raises before anything is written. ``tick``: the schedule and the
    time it fired for (``services.firing``), stored on the run and in its ``started`` event.
    ``delay``: the first step is due that long after now, not after its own ``wait`` (a
    task's ``run_after``). A class with ``debounce`` may return an earlier run of the key
    instead (``services.debounce``). ``actor`` and ``reason`` go on the ``started`` event.
    """
    subject_type, subject_id, payload = _checked(cls, subject, idempotency_key, arguments)
    debounced = debounced_key(cls, subject, subject_type, subject_id, payload, tick is not None or rerun_of is not None)
    _warn_if_unknown_to_dispatchers(cls)
    try:
        if debounced is not None:
            given = (idempotency_key, subject_type, subject_id, payload)
            return _start_debounced(cls, *debounced, given, (actor, reason))
        audit = (actor, reason)
        return _insert(cls, subject_type, subject_id, idempotency_key, payload, audit, rerun_of, tick, delay=delay)
    except (ProgrammingError, OperationalError) as error:
        not_migrated = explain(error)
        if not_migrated is not None:
            raise not_migrated from None
        raise


def _start_debounced(cls: type[H], declared: Debounce, key: str, checked: Checked, audit: Audit) -> H:
    """Collapse into the key's run that has not begun, or start one; the idempotency key is asked first.

    A key used before, by the run's first start or by a start that collapsed into it, gives
    that run (``duplicate_start``) when this start gives what that one gave: nothing moves.
    """
    idempotency_key, subject_type, subject_id, payload = checked
    with transaction.atomic():
        lock_key(cls, key)
        if idempotency_key is not None:
            used = start_of_key(cls, idempotency_key)
            if used is not None:
                run, given = used
                return same_start(cls, run, subject_type, subject_id, payload, (idempotency_key, *given))
        collapsed = collapse(cls, declared, key, (subject_type, subject_id, payload), idempotency_key)
        if collapsed is not None:
            return collapsed
        return _insert(cls, subject_type, subject_id, idempotency_key, payload, audit, None, debounce=(key, declared))


def _checked(
    cls: type[RunHandle], subject: Model | None, idempotency_key: str | None, arguments: dict[str, Any] | None
) -> tuple[str | None, str | None, dict[str, Any]]:
    """``(subject type, subject id, arguments as stored)`` of a start; raises on bad input."""
    if cls.__dict__.get("abstract", False):
        raise ConfigurationError(f"{cls.__qualname__} is abstract: start one of its subclasses")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
        raise ValueError(f"idempotency_key must be a non-empty string or None, got {idempotency_key!r}")
    if idempotency_key is not None and len(idempotency_key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"idempotency_key must be at most {MAX_KEY_LENGTH} characters, got {len(idempotency_key)}: hash it"
        )
    subject_type, subject_id = subject_reference(subject)
    payload = encode_payload(arguments or {}, f"{cls.name} arguments")
    if not isinstance(payload, dict):
        raise TypeError("arguments must be keyword arguments")
    return subject_type, subject_id, payload


def new_run(
    cls: type[RunHandle],
    first: StepDefinition | None,
    now: datetime,
    subject_type: str | None,
    subject_id: str | None,
    idempotency_key: str | None,
    payload: dict[str, Any],
    rerun_of: WorkflowRun | None = None,
    tick: Tick | None = None,
    lineage: dict[str, Any] | None = None,
    debounce_key: str | None = None,
) -> WorkflowRun:
    """An unsaved run row of ``cls`` on step ``first``, as a start makes it (``services.forking`` makes a fork's)."""
    return rows.build(
        WorkflowRun,
        workflow_class=cls.name,
        current_step=first.name if first is not None else "",
        subject_type=subject_type,
        subject_id=subject_id,
        arguments=payload,
        idempotency_key=idempotency_key,
        allow_multiple=cls.allow_multiple,
        rerun_of=rerun_of.workflow_id if rerun_of else None,
        created_at=now,
        started_at=now,
        status_changed_at=now,
        schedule_id=tick[0] if tick else None,
        scheduled_for=tick[1] if tick else None,
        debounce_key=debounce_key,
        # A child joins its parent's trace (its park runs outside any span); a top run its caller's.
        **{"trace_context": tracing.carrier(), **(lineage or {})},
    )


def _insert(
    cls: type[H],
    subject_type: str | None,
    subject_id: str | None,
    idempotency_key: str | None,
    payload: dict[str, Any],
    audit: Audit,
    rerun_of: WorkflowRun | None,
    tick: Tick | None = None,
    lineage: dict[str, Any] | None = None,
    debounce: tuple[str, Debounce] | None = None,  # (key, declaration): the first attempt waits its period
    delay: timedelta | None = None,
) -> H:
    now = clock.now()
    first = cls.next_step_after(None)
    key = debounce[0] if debounce else None
    record = new_run(cls, first, now, subject_type, subject_id, idempotency_key, payload, rerun_of, tick, lineage, key)
    ledger = RunLedger(record, now)
    details: dict[str, Any] = {"arguments": payload}
    if rerun_of is not None:
        details["rerun_of"] = str(rerun_of.workflow_id)
    if tick is not None:
        details["schedule_id"], details["scheduled_for"] = tick[0], tick[1].isoformat()
    if record.parent is not None:
        details["parent"] = str(record.parent.workflow_id)
    actor, reason = audit
    started: dict[str, Any] = {"actor": actor, "reason": reason, "details": details}
    started["transition"] = ("", "", RunStatus.READY)
    if first is not None and sql.postgresql() and debounce is None:
        # The common case in one statement: no transaction of its own, no savepoint, no
        # lookup of the key first (a refused insert writes nothing and raises nothing).
        step = ledger.new_attempt(first, 1, resolve_wait(first.wait, 1) if delay is None else delay)
        event = ledger.new_event("started", **started)
        fair = fairness.place(cls, step, record, now, lambda: cls(record))  # a bad key: nothing written
        if not rows.insert_run(record, step, event, (settings.NOTIFY_CHANNEL, step.queue)):
            return conflict(cls, subject_type, subject_id, idempotency_key, payload)
        if fair is not None:  # a class with Fairness: the step's place, once the run has its key
            fairness.write([(record.pk, *fair[1:])])
        ledger.send(signals.workflow_started, subject_type=subject_type, subject_id=subject_id)
        ledger.flush()  # only the after-commit signal is left to queue
        return cls(record)
    with transaction.atomic():
        if idempotency_key is not None:
            existing = WorkflowRun.objects.filter(workflow_class=cls.name, idempotency_key=idempotency_key).first()
            if existing is not None:
                return same_start(cls, existing, subject_type, subject_id, payload)
        try:
            with transaction.atomic():
                rows.insert(record)
        except IntegrityError:
            return conflict(cls, subject_type, subject_id, idempotency_key, payload)
        ledger.event("started", **started)
        if first is None:
            ledger.transition("finish", RunStatus.FINISHED, kind="finished", actor=actor, reason="no steps")
        else:
            ledger.schedule(first, attempt=1, wait=debounce[1].period if debounce else delay)
        ledger.send(signals.workflow_started, subject_type=subject_type, subject_id=subject_id)
        ledger.flush()
    return cls(record)


_warned: set[str] = set()


def _warn_if_unknown_to_dispatchers(cls: type[RunHandle]) -> None:
    """A class defined after app loading (not in a ``workflows`` module) is unknown to dispatchers."""
    if cls.name in _warned or not registry.registered_late(cls.name):
        return
    _warned.add(cls.name)
    logger.warning(
        "%s (%s.%s) was defined after Django loaded the apps, so dispatchers, which import each app's "
        "%s module, may not know it: its runs would wait, then pause after UNKNOWN_STEP_GRACE. "
        "Define it in <app>/%s.py (or import it from there).",
        cls.name,
        cls.__module__,
        cls.__qualname__,
        settings.AUTODISCOVER_MODULE,
        settings.AUTODISCOVER_MODULE,
    )


#: The keys a mapping item of :func:`start_runs` may have.
ITEM_KEYS = frozenset({"subject", "idempotency_key", "arguments"})


def start_runs(cls: type[H], items: Iterable[Model | Mapping[str, Any] | None], audit: Audit = (None, None)) -> list[H]:
    """Start one run of ``cls`` per item in one transaction: one ``INSERT`` per table for all of them.

    An item is a subject (a saved model instance, or None) or a mapping with any of
    ``subject``, ``idempotency_key`` and ``arguments``. The rules are ``start()``'s: bad
    input raises before anything is written; a key already used for the same start gives
    the first run's handle (``duplicate_start``), for another start :class:`IdempotencyConflict`;
    a subject with an ongoing run (or two items for one subject) raises :class:`AlreadyRunning`,
    and then nothing of the call is written. Returns the handles in the items' order.
    ``audit``: the ``(actor, reason)`` of every ``started`` event.
    """
    if cls.debounce is not None:
        raise ConfigurationError(
            f"{cls.__qualname__} has debounce: start_many() does not collapse starts; start each run with start()"
        )
    checked = []
    for number, item in enumerate(items):
        subject, key, arguments = _item(item, number)
        checked.append((key, *_checked(cls, subject, key, arguments)))
    if not checked:
        return []
    _warn_if_unknown_to_dispatchers(cls)
    first = cls.next_step_after(None)
    try:
        with transaction.atomic():
            if first is None:  # nothing to schedule: each run finishes at once, as start() does it
                return [_insert(cls, st, si, key, payload, audit, None) for key, st, si, payload in checked]
            return _insert_many(cls, first, checked, audit=audit)
    except (ProgrammingError, OperationalError) as error:
        not_migrated = explain(error)
        if not_migrated is not None:
            raise not_migrated from None
        raise


def _item(item: Any, number: int) -> tuple[Any, str | None, dict[str, Any] | None]:
    """``(subject, idempotency key, arguments)`` of one item of :func:`start_runs`."""
    if not isinstance(item, Mapping):
        return item, None, None
    unknown = set(item) - ITEM_KEYS
    if unknown:
        raise TypeError(
            f"start_many() item {number} has unknown keys {sorted(unknown)}: an item is a subject, or a mapping "
            f"of {sorted(ITEM_KEYS)}"
        )
    arguments = item.get("arguments")
    if arguments is not None and not isinstance(arguments, Mapping):
        raise TypeError(f"start_many() item {number}: arguments must be a mapping, got {type(arguments).__name__}")
    return item.get("subject"), item.get("idempotency_key"), None if arguments is None else dict(arguments)


#: ``(idempotency key, subject type, subject id, arguments as stored)`` of one checked start.
Checked = tuple[str | None, str | None, str | None, Any]


def start_children(cls: type[H], checked: list[Checked], lineages: list[dict[str, Any]], actor: str) -> list[H]:
    """Start child runs of ``cls`` inside the caller's transaction (the parent's park), as :func:`start_runs`.

    ``checked`` come from :func:`check_start`; ``lineages`` are each child's parent fields.
    A key already used gives that run's handle with ``duplicate_start`` (the caller re-attaches it).
    """
    first = cls.next_step_after(None)
    if first is None:  # nothing to schedule: each child finishes at once, as start() does it
        return [
            _insert(cls, st, si, key, payload, (actor, None), None, lineage=lineage)
            for (key, st, si, payload), lineage in zip(checked, lineages, strict=True)
        ]
    return _insert_many(cls, first, checked, lineages, (actor, None))


def check_start(
    cls: type[RunHandle], subject: Model | None, idempotency_key: str | None, arguments: dict[str, Any] | None
) -> Checked:
    """The checked start of one run (``start()``'s rules); raises on bad input, writes nothing."""
    return (idempotency_key, *_checked(cls, subject, idempotency_key, arguments))


def _insert_many(
    cls: type[H],
    first: StepDefinition,
    checked: list[Checked],
    lineages: list[dict[str, Any]] | None = None,
    audit: Audit = (None, None),
) -> list[H]:
    now = clock.now()
    lineage_of = lineages or [{}] * len(checked)
    records = [
        new_run(cls, first, now, st, si, key, payload, lineage=lineage)
        for (key, st, si, payload), lineage in zip(checked, lineage_of, strict=True)
    ]
    as_uuid = WorkflowRun._meta.get_field("workflow_id").to_python  # SQLite returns the text
    keys = {}
    # PostgreSQL: bound on the server, so the arrays go in binary, not spelled out in the text.
    with sql.pipeline() if sql.postgresql() else sql.cursor() as cursor:
        for text, params in bulk.insert_statements(records, returning=("id", "workflow_id"), skip_conflicts=True):
            cursor.execute(text, params)
            keys.update({as_uuid(workflow_id): pk for pk, workflow_id in cursor.fetchall()})
    for record in records:
        if record.workflow_id in keys:
            rows.mark_saved(record, keys[record.workflow_id])
    handles = []
    for record, (key, st, si, payload) in zip(records, checked, strict=True):
        # a refused run: a key used before (its run, or IdempotencyConflict) or a subject taken (AlreadyRunning)
        handles.append(cls(record) if record.pk is not None else conflict(cls, st, si, key, payload))
    new = [record for record in records if record.pk is not None]
    if not new:
        return handles
    # Every first attempt is alike, and every event but for its run: made once, copied.
    ledger = RunLedger(new[0], now)
    attempt = ledger.new_attempt(first, 1, resolve_wait(first.wait, 1))
    started = ledger.new_event("started", actor=audit[0], reason=audit[1], transition=("", "", RunStatus.READY))
    writes = bulk.WriteBatch()
    writes.inserts = [rows.clone(attempt, run_id=r.pk, limiters=bind_copy(cls, first, r, attempt)) for r in new]
    writes.rows = [rows.clone(started, run_id=record.pk, details=_started_details(record)) for record in new]
    tags = [fairness.place(cls, attempt, r, now, lambda r=r: cls(r)) for r in new]  # type: ignore[misc]
    fairness.write([found for found in tags if found is not None], writes)
    writes.notify.add(attempt.queue)
    if signals.workflow_started.has_listeners():
        sent = [(record.workflow_id, record.subject_type, record.subject_id) for record in new]
        transaction.on_commit(lambda: _send_started(cls.name, sent))
    writes.send(settings.NOTIFY_CHANNEL)
    return handles


def _started_details(record: WorkflowRun) -> dict[str, Any]:
    parent = record.parent if record.parent_id is not None else None
    if parent is None:
        return {"arguments": record.arguments}
    return {"arguments": record.arguments, "parent": str(parent.workflow_id)}


def _send_started(sender: str, started: list[tuple[Any, str | None, str | None]]) -> None:
    for workflow_id, subject_type, subject_id in started:
        signals.workflow_started.send(
            sender=sender, workflow_id=workflow_id, subject_type=subject_type, subject_id=subject_id
        )
