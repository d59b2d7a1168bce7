"""Debounced starts: a ``start()`` of a key whose run has not begun its first step collapses into it.

A class with ``debounce = Debounce(...)`` (``dsl.debounce``) stores each new run's key
(``WorkflowRun.debounce_key``) and schedules its first step ``period`` later. A later
``start()`` of the key, while that step is still its first attempt, scheduled, gives the run
the new arguments and moves the step to ``period`` from now, never past ``max_wait`` after
the run's creation, and records a ``debounced`` event (with the start's idempotency key, which
:func:`start_of_key` finds again: a repeat of that start gives the run and moves nothing).
``services.start`` calls these under :func:`lock_key`, so two starts of one key never both
miss the run and create two.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from .. import sql
from ..dsl.debounce import MAX_DEBOUNCE_KEY_LENGTH, Debounce, valid_key
from ..dsl.text import unstorable
from ..models import WorkflowEvent, WorkflowRun
from ..sql import rows
from ..states import RunStatus, StepStatus
from . import limiting
from .ledger import RunLedger

if TYPE_CHECKING:
    from django.db.models import Model

    from .handle import RunHandle

H = TypeVar("H", bound="RunHandle")

#: What a start gives: its subject type, its subject id and its arguments as stored.
Given = tuple[str | None, str | None, Any]

#: The default key of a start without a subject: the class's subject-less starts collapse together.
NO_SUBJECT_KEY = "none"


def debounced_key(
    cls: type[RunHandle],
    subject: Model | None,
    subject_type: str | None,
    subject_id: str | None,
    payload: dict[str, Any],
    undebounced: bool,
) -> tuple[Debounce, str] | None:
    """``(the class's Debounce, the start's key)`` when this start is debounced, else None (nothing asked).

    Only ``start()`` of a class with steps is: a schedule's tick or a rerun (``undebounced``)
    starts its run as without debounce. ``ValueError`` naming the class when the key callable
    raises or gives a bad key.
    """
    debounce = cls.debounce
    if debounce is None or undebounced or cls.next_step_after(None) is None:
        return None
    spec = debounce.key
    if spec is None:
        key: Any = NO_SUBJECT_KEY if subject_type is None else f"{subject_type}:{subject_id}"
    elif callable(spec):
        handle = cls(
            rows.build(
                WorkflowRun,
                workflow_class=cls.name,
                subject_type=subject_type,
                subject_id=subject_id,
                arguments=payload,
            )
        )
        handle._subject_cache = (subject,)  # the key reads the subject given, without a query
        try:
            key = spec(handle)
        except Exception as error:
            raise ValueError(
                f"{cls.__qualname__}.debounce key raised {type(error).__name__}: {error}; nothing was started"
            ) from error
    else:
        key = spec
    if not valid_key(key):
        raise ValueError(
            f"{cls.__qualname__}.debounce key must be a non-empty string of at most {MAX_DEBOUNCE_KEY_LENGTH} "
            f"characters that PostgreSQL can store, got {key!r}{_why(key)}; nothing was started"
        )
    return debounce, key


def _why(key: Any) -> str:
    reason = unstorable(key)
    return f" ({reason})" if reason else ""


def lock_key(cls: type[RunHandle], key: str) -> None:
    """Hold the key until the caller's transaction ends (PostgreSQL; on SQLite one writer at a time does it)."""
    if sql.postgresql():
        with sql.cursor() as cursor:
            # The class name's length keeps ("a:b", "c") and ("a", "b:c") apart.
            cursor.execute(sql.statement("debounce_lock"), [f"{len(cls.name)}:{cls.name}:{key}"])


def collapse(cls: type[H], debounce: Debounce, key: str, start: Given, idempotency_key: str | None) -> H | None:
    """Give the key's run that has not begun these arguments and a later first step; its handle, or None.

    None when the key has no such run: none is ready, or its active attempt is not the first
    attempt of the first step, still scheduled (it began, or an operator moved it on).
    ``start``: the subject type, subject id and arguments this start gives.
    """
    run = (
        WorkflowRun.objects.select_for_update()
        .filter(workflow_class=cls.name, debounce_key=key, status=RunStatus.READY)
        .order_by("-pk")  # a newer run of the key exists only once the older ones began
        .first()
    )
    if run is None:
        return None
    ledger = RunLedger(run)
    step = ledger.active_step()
    first = cls.next_step_after(None)
    not_begun = (first.name if first else None, 1, StepStatus.SCHEDULED)
    if step is None or (step.step_name, step.attempt, step.status) != not_begun:
        return None
    subject_type, subject_id, payload = start
    previous = step.scheduled_at
    due, capped = _due(debounce, ledger.now, run.created_at)
    ledger.set_run(arguments=payload)
    step.scheduled_at = due
    if step.limiters is not None and first is not None:  # keys of the latest arguments
        step.limiters = limiting.bind(cls, first, run, ledger.now)
    rows.update(step, ["scheduled_at", "limiters"])
    details: dict[str, Any] = {
        "arguments": payload,
        "previous_scheduled_at": previous.isoformat(),
        "scheduled_at": due.isoformat(),
    }
    if capped:
        details["max_wait_reached"] = True
    if idempotency_key is not None:
        details["idempotency_key"] = idempotency_key
    if (subject_type, subject_id) != (run.subject_type, run.subject_id):  # a key callable may join subjects
        details["subject"] = [subject_type, subject_id]
    ledger.event("debounced", reason=_moved(step.step_name, previous, due, capped), details=details)
    ledger.flush()
    return cls(run, debounced=True)


def start_of_key(cls: type[RunHandle], idempotency_key: str) -> tuple[WorkflowRun, Given] | None:
    """The run a start of ``cls`` with this idempotency key went into, and what that start gave; or None.

    The run that holds the key (its first start: the ``started`` event has the arguments it
    gave, a debounced run's own being the latest start's), else the run a start with the key
    collapsed into (its ``debounced`` event, found through ``pgbus_wf_event_debounced_key``).
    """
    run = WorkflowRun.objects.filter(workflow_class=cls.name, idempotency_key=idempotency_key).first()
    if run is not None:
        arguments = run.arguments
        if run.debounce_key is not None:
            started = WorkflowEvent.objects.filter(run_id=run.pk, kind="started").order_by("pk").first()
            arguments = started.details.get("arguments", arguments) if started is not None else arguments
        return run, (run.subject_type, run.subject_id, arguments)
    event = (
        WorkflowEvent.objects.filter(
            kind="debounced", details__idempotency_key=idempotency_key, run__workflow_class=cls.name
        )
        .select_related("run")
        .order_by("pk")
        .first()
    )
    if event is None:
        return None
    subject_type, subject_id = event.details.get("subject", (event.run.subject_type, event.run.subject_id))
    # An event written before the events held the arguments (argument_keys only): the run's are compared.
    return event.run, (subject_type, subject_id, event.details.get("arguments", event.run.arguments))


def _moved(step_name: str, previous: datetime, due: datetime, capped: bool) -> str:
    """The event's note: ``push moved from 12:00:30 to 12:00:45 UTC`` (the date too when it differs)."""
    old, new = (moment.astimezone(UTC) for moment in (previous, due))
    shape = "%H:%M:%S" if old.date() == new.date() else "%Y-%m-%d %H:%M:%S"
    note = f"{step_name} moved from {old:{shape}} to {new:{shape}} UTC"
    return f"{note} (max_wait)" if capped else note


def _due(debounce: Debounce, now: datetime, created_at: datetime) -> tuple[datetime, bool]:
    """When the first step is due after a start at ``now``, and whether ``max_wait`` bounded it."""
    due = now + debounce.period
    if debounce.max_wait is not None and due > created_at + debounce.max_wait:
        return created_at + debounce.max_wait, True
    return due, False
