"""Starting a run: the run row, its first step and a ``started`` event, in one transaction."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, OperationalError, ProgrammingError, transaction
from django.db.models import Model

from .. import clock, rows, signals, sql
from ..conf import settings
from ..definitions import resolve_wait
from ..exceptions import AlreadyRunning, ConfigurationError, IdempotencyConflict
from ..migrated import explain
from ..models import WorkflowRun
from ..registry import registry
from ..states import RunStatus
from .ledger import RunLedger
from .payload import encode_payload, subject_reference

logger = logging.getLogger("pgbus_workflows")

#: Longest idempotency key or signal name a row holds.
MAX_KEY_LENGTH = 255

if TYPE_CHECKING:
    from ..workflow import Workflow


def start_run(
    cls: type[Workflow],
    subject: Model | None,
    *,
    idempotency_key: str | None = None,
    arguments: dict[str, Any] | None = None,
    actor: str | None = None,
    rerun_of: WorkflowRun | None = None,
) -> Workflow:
    """Create a run of ``cls`` and schedule its first step; returns the handle.

    Works inside the caller's ``transaction.atomic()`` (the dispatcher sees nothing until it
    commits). Bad input raises before anything is written.
    """
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
    _warn_if_unknown_to_dispatchers(cls)
    try:
        return _insert(cls, subject_type, subject_id, idempotency_key, payload, actor, rerun_of)
    except (ProgrammingError, OperationalError) as error:
        not_migrated = explain(error)
        if not_migrated is not None:
            raise not_migrated from None
        raise


def _insert(
    cls: type[Workflow],
    subject_type: str | None,
    subject_id: str | None,
    idempotency_key: str | None,
    payload: dict[str, Any],
    actor: str | None,
    rerun_of: WorkflowRun | None,
) -> Workflow:
    now = clock.now()
    first = cls.next_step_after(None)
    record = rows.build(
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
    )
    ledger = RunLedger(record, now)
    details: dict[str, Any] = {"arguments": payload}
    if rerun_of is not None:
        details["rerun_of"] = str(rerun_of.workflow_id)
    started: dict[str, Any] = {"actor": actor, "details": details, "transition": ("", "", RunStatus.READY)}
    if first is not None and sql.postgresql():
        # The common case in one statement: no transaction of its own, no savepoint, no
        # lookup of the key first (a refused insert writes nothing and raises nothing).
        step = ledger.new_attempt(first, 1, resolve_wait(first.wait, 1))
        event = ledger.new_event("started", **started)
        if not rows.insert_run(record, step, event, (settings.NOTIFY_CHANNEL, step.queue)):
            return _conflict(cls, subject_type, subject_id, idempotency_key, payload)
        ledger.send(signals.workflow_started, subject_type=subject_type, subject_id=subject_id)
        ledger.flush()  # only the after-commit signal is left to queue
        return cls(record)
    with transaction.atomic():
        if idempotency_key is not None:
            existing = WorkflowRun.objects.filter(workflow_class=cls.name, idempotency_key=idempotency_key).first()
            if existing is not None:
                return _same_start(cls, existing, subject_type, subject_id, payload)
        try:
            with transaction.atomic():
                rows.insert(record)
        except IntegrityError:
            return _conflict(cls, subject_type, subject_id, idempotency_key, payload)
        ledger.event("started", **started)
        if first is None:
            ledger.transition("finish", RunStatus.FINISHED, kind="finished", actor=actor, reason="no steps")
        else:
            ledger.schedule(first, attempt=1)
        ledger.send(signals.workflow_started, subject_type=subject_type, subject_id=subject_id)
        ledger.flush()
    return cls(record)


def _same_start(
    cls: type[Workflow], existing: WorkflowRun, subject_type: str | None, subject_id: str | None, payload: Any
) -> Workflow:
    """The run that holds the key, when this start asks for the same; else :class:`IdempotencyConflict`."""
    differences = []
    if (existing.subject_type, existing.subject_id) != (subject_type, subject_id):
        differences.append(
            f"subject {existing.subject_type or 'none'} {existing.subject_id or ''}".rstrip()
            + f", not {subject_type or 'none'} {subject_id or ''}".rstrip()
        )
    if existing.arguments != payload:
        differences.append("other arguments")
    if differences:
        raise IdempotencyConflict(
            f"idempotency_key {existing.idempotency_key!r} of {cls.name} is taken by run {existing.workflow_id} "
            f"({'; '.join(differences)}): nothing was started. Use a key per subject and arguments.",
            workflow=cls(existing),
        )
    return cls(existing, duplicate_start=True)


_warned: set[str] = set()


def _warn_if_unknown_to_dispatchers(cls: type[Workflow]) -> None:
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


def _conflict(
    cls: type[Workflow],
    subject_type: str | None,
    subject_id: str | None,
    idempotency_key: str | None,
    payload: Any,
) -> Workflow:
    """Explain a unique violation: a concurrent start with the same key, or an ongoing run."""
    if idempotency_key is not None:
        existing = WorkflowRun.objects.filter(workflow_class=cls.name, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _same_start(cls, existing, subject_type, subject_id, payload)
    holder = WorkflowRun.objects.ongoing().for_subject(subject_type, subject_id).filter(workflow_class=cls.name).first()
    handle = cls(holder) if holder is not None else None
    raise AlreadyRunning(
        f"{cls.name} already has an ongoing run for {subject_type} {subject_id}"
        + (f": {holder.workflow_id} ({holder.status})" if holder else ""),
        workflow=handle,
    )
