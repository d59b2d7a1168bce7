"""Starting a run: the run row, its first step and a ``started`` event, in one transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models import Model

from .. import clock, signals
from ..exceptions import AlreadyRunning, ConfigurationError
from ..models import WorkflowRun
from ..states import RunStatus
from .ledger import RunLedger
from .payload import encode_payload, subject_reference

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
    with transaction.atomic():
        if idempotency_key is not None:
            existing = WorkflowRun.objects.filter(workflow_class=cls.name, idempotency_key=idempotency_key).first()
            if existing is not None:
                return cls(existing, duplicate_start=True)
        now = clock.now()
        record = WorkflowRun(
            workflow_class=cls.name,
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
        try:
            with transaction.atomic():
                record.save(force_insert=True)
        except IntegrityError:
            return _conflict(cls, subject_type, subject_id, idempotency_key)
        ledger = RunLedger(record, now)
        details: dict[str, Any] = {"arguments": payload}
        if rerun_of is not None:
            details["rerun_of"] = str(rerun_of.workflow_id)
        ledger.event("started", actor=actor, step=None, details=details, transition=("", "", RunStatus.READY))
        first = cls.next_step_after(None)
        if first is None:
            ledger.transition("finish", RunStatus.FINISHED, kind="finished", actor=actor, reason="no steps")
        else:
            ledger.schedule(first, attempt=1)
        ledger.send(signals.workflow_started, subject_type=subject_type, subject_id=subject_id)
        ledger.flush()
    return cls(record)


def _conflict(
    cls: type[Workflow], subject_type: str | None, subject_id: str | None, idempotency_key: str | None
) -> Workflow:
    """Explain a unique violation: a concurrent start with the same key, or an ongoing run."""
    if idempotency_key is not None:
        existing = WorkflowRun.objects.filter(workflow_class=cls.name, idempotency_key=idempotency_key).first()
        if existing is not None:
            return cls(existing, duplicate_start=True)
    holder = WorkflowRun.objects.ongoing().for_subject(subject_type, subject_id).filter(workflow_class=cls.name).first()
    handle = cls(holder) if holder is not None else None
    raise AlreadyRunning(
        f"{cls.name} already has an ongoing run for {subject_type} {subject_id}"
        + (f": {holder.workflow_id} ({holder.status})" if holder else ""),
        workflow=handle,
    )
