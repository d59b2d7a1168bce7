"""Delivering signals: a named message to a run, consumed once by a step that waits for it."""

from __future__ import annotations

import difflib
from typing import Any

from .. import signals
from ..dsl.declared import DeclaredWorkflow, registry
from ..exceptions import NotOngoing, UnknownSignal
from ..models import WorkflowSignal, WorkflowStep
from ..states import TERMINAL_RUN, StepStatus
from .locks import locked_run
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

    A signal no step waits for *now* stays pending for a later step; a name that no step of
    the class waits for at all raises :class:`UnknownSignal` (a run of a class this process's
    code does not have accepts any name: newer code may know it). ``payload`` None is ``{}``. A repeated
    ``idempotency_key`` returns the first signal with ``duplicate_delivery = True`` and
    moves nothing. Raises :class:`NotOngoing` for a finished or cancelled run. Works inside
    the caller's ``transaction.atomic()``: a rollback leaves no signal.
    """
    check_signal_input(name, idempotency_key, actor)
    data = encode_payload({} if payload is None else payload, f"signal {name!r} payload")
    actor = actor or DEFAULT_ACTOR
    with locked_run(run_pk) as ledger:
        run = ledger.run
        check_signal_name(ledger.cls, name)
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
        matched = active is not None and active.status == StepStatus.WAITING and name in waits_for(ledger.cls, active)
        if matched and active is not None:
            consume(ledger, signal, active)
            wake(ledger, active, kind="step_woken", actor=actor, details={"signal": name}, signal=signal)
        ledger.send(signals.signal_received, name=name, duplicate=False, matched=matched)
    return signal


def check_signal_input(name: Any, idempotency_key: Any, actor: Any = None) -> None:
    """Raise ``ValueError`` for a signal name, key or actor that no row can hold."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"A signal name must be a non-empty string, got {name!r}")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
        raise ValueError(f"idempotency_key must be a non-empty string or None, got {idempotency_key!r}")
    for what, value in (("A signal name", name), ("idempotency_key", idempotency_key), ("actor", actor)):
        if value is not None and len(value) > MAX_KEY_LENGTH:
            raise ValueError(f"{what} must be at most {MAX_KEY_LENGTH} characters, got {len(value)}")


def check_signal_name(cls: type[DeclaredWorkflow], name: str) -> None:
    """Raise :class:`UnknownSignal` unless a step of ``cls`` waits for ``name`` (or ``extra_signals`` lists it)."""
    if registry.get(cls.name) is not cls or cls.accepts_signal(name):  # a class this code lacks: any name
        return
    names = sorted(cls.signal_names())
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    waits = ", ".join(names) if names else "no signal"
    raise UnknownSignal(
        f"No step of {cls.name} waits for signal {name!r}{hint}. Its steps wait for: {waits} "
        "(list a name in the class's extra_signals to accept it anyway)"
    )


def waits_for(cls: type[DeclaredWorkflow], step: WorkflowStep) -> list[str]:
    """The names a waiting attempt takes: those it parked with, then its step's current ones (a rename)."""
    definition = cls.step_definition(step.step_name)
    return list(dict.fromkeys([*(step.wait_for or []), *(definition.wait_for if definition is not None else ())]))
