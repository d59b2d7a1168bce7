"""Delivering signals: a named message to a run, consumed once by a step that waits for it."""

from __future__ import annotations

from typing import Any

from .. import signals
from ..exceptions import NotOngoing
from ..models import WorkflowSignal
from ..states import TERMINAL_RUN, StepStatus
from .ledger import locked_run
from .payload import encode_payload
from .start import MAX_KEY_LENGTH
from .waiting import consume, wake

DEFAULT_ACTOR = "api"


def deliver_signal(
    run_pk: int,
    name: str,
    payload: Any = None,
    idempotency_key: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
) -> WorkflowSignal:
    """Store a signal for the run and wake its step when that step waits for ``name``.

    A signal no step waits for stays pending for a later step. A repeated
    ``idempotency_key`` returns the first signal with ``duplicate_delivery = True`` and
    moves nothing. Raises :class:`NotOngoing` for a finished or cancelled run. Works inside
    the caller's ``transaction.atomic()``: a rollback leaves no signal.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"A signal name must be a non-empty string, got {name!r}")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
        raise ValueError(f"idempotency_key must be a non-empty string or None, got {idempotency_key!r}")
    for what, value in (("A signal name", name), ("idempotency_key", idempotency_key), ("actor", actor)):
        if value is not None and len(value) > MAX_KEY_LENGTH:
            raise ValueError(f"{what} must be at most {MAX_KEY_LENGTH} characters, got {len(value)}")
    data = encode_payload(payload, f"signal {name!r} payload")
    actor = actor or DEFAULT_ACTOR
    with locked_run(run_pk) as ledger:
        run = ledger.run
        if idempotency_key is not None:
            first = WorkflowSignal.objects.filter(run_id=run.pk, idempotency_key=idempotency_key).first()
            if first is not None:
                first.duplicate_delivery = True
                ledger.send(signals.signal_received, name=name, duplicate=True, matched=False)
                return first
        if run.status in TERMINAL_RUN:
            raise NotOngoing(f"Cannot signal a {run.status} workflow ({run.workflow_id}): signal {name!r} refused")
        signal = WorkflowSignal.objects.create(
            run=run,
            name=name,
            payload=data,
            idempotency_key=idempotency_key,
            actor=actor,
            reason=reason or "",
            received_at=ledger.now,
        )
        ledger.event("signal_received", actor=actor, reason=reason, details={"signal": name, "signal_id": signal.pk})
        active = ledger.active_step()
        matched = active is not None and active.status == StepStatus.WAITING and name in (active.wait_for or [])
        if matched and active is not None:
            consume(ledger, signal, active)
            wake(ledger, active, kind="step_woken", actor=actor, details={"signal": name}, signal=signal)
        ledger.send(signals.signal_received, name=name, duplicate=False, matched=matched)
    return signal
