"""A start that the database refused or that repeats a key: the run it gives, or why it was refused.

``services.start`` asks these when an insert is refused by a unique index (an idempotency key
used before, a subject with an ongoing run) or when a key's lookup finds its run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import AlreadyRunning, IdempotencyConflict
from ..models import WorkflowRun

if TYPE_CHECKING:
    from .handle import RunHandle

H = TypeVar("H", bound="RunHandle")


def same_start(
    cls: type[H],
    existing: WorkflowRun,
    subject_type: str | None,
    subject_id: str | None,
    payload: Any,
    used: tuple[str, str | None, str | None, Any] | None = None,
) -> H:
    """The run that holds the key, when this start asks for the same; else :class:`IdempotencyConflict`.

    ``used``: the key and what the start that used it gave (subject type, subject id,
    arguments), when that is not the run's own row (a debounced run's arguments are its
    latest start's, and a start that collapsed into it used a key of its own).
    """
    key, *given = used or (existing.idempotency_key, existing.subject_type, existing.subject_id, existing.arguments)
    differences = []
    if (given[0], given[1]) != (subject_type, subject_id):
        differences.append(
            f"subject {given[0] or 'none'} {given[1] or ''}".rstrip()
            + f", not {subject_type or 'none'} {subject_id or ''}".rstrip()
        )
    if given[2] != payload:
        differences.append("other arguments")
    if differences:
        raise IdempotencyConflict(
            f"idempotency_key {key!r} of {cls.name} is taken by run {existing.workflow_id} "
            f"({'; '.join(differences)}): nothing was started. Use a key per subject and arguments.",
            workflow=cls(existing),
        )
    return cls(existing, duplicate_start=True)


def conflict(
    cls: type[H],
    subject_type: str | None,
    subject_id: str | None,
    idempotency_key: str | None,
    payload: Any,
) -> H:
    """Explain a unique violation: a concurrent start with the same key, or an ongoing run."""
    if idempotency_key is not None:
        existing = WorkflowRun.objects.filter(workflow_class=cls.name, idempotency_key=idempotency_key).first()
        if existing is not None:
            return same_start(cls, existing, subject_type, subject_id, payload)
    holder = WorkflowRun.objects.ongoing().for_subject(subject_type, subject_id).filter(workflow_class=cls.name).first()
    handle = cls(holder) if holder is not None else None
    raise AlreadyRunning(
        f"{cls.name} already has an ongoing run for {subject_type} {subject_id}"
        + (f": {holder.workflow_id} ({holder.status})" if holder else ""),
        workflow=handle,
    )
