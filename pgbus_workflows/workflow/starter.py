"""``Cls.started_by(actor, reason=...)``: start runs with who started them and why on their audit trail.

``start()`` passes every keyword but ``idempotency_key`` to the run as an argument, so the actor
and the reason cannot be keywords of ``start()`` without taking those names from users'
workflows. They are given first instead, to a :class:`Starter` whose ``start``, ``astart`` and
``start_many`` are the class's own, and are stored on each run's ``started`` event, where the
admin's run page, ``manage.py workflows show`` and the MCP tool ``show_run`` read them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from asgiref.sync import sync_to_async

from ..dsl.text import unstorable

if TYPE_CHECKING:
    from django.db.models import Model

    from ..services.handle import RunHandle

W = TypeVar("W", bound="RunHandle")

#: The longest reason a start may give (as the admin's reason field).
MAX_START_REASON_LENGTH = 2000


@dataclass(frozen=True)
class Starter(Generic[W]):
    """Starts runs of ``workflow`` recording ``actor`` and ``reason`` (see :meth:`Workflow.started_by`)."""

    workflow: type[W]
    actor: str
    reason: str | None = None

    def __post_init__(self) -> None:
        from ..services.ledger import MAX_ACTOR_LENGTH  # deferred: this module loads before the app registry

        if not isinstance(self.actor, str) or not self.actor.strip():
            raise ValueError(f"started_by() needs an actor: a non-empty string, got {self.actor!r}")
        if len(self.actor) > MAX_ACTOR_LENGTH:
            raise ValueError(f"started_by() actor must be at most {MAX_ACTOR_LENGTH} characters, got {len(self.actor)}")
        if self.reason is not None and not isinstance(self.reason, str):
            raise ValueError(f"started_by() reason must be a string or None, got {type(self.reason).__name__}")
        if self.reason is not None and len(self.reason) > MAX_START_REASON_LENGTH:
            raise ValueError(
                f"started_by() reason must be at most {MAX_START_REASON_LENGTH} characters, got {len(self.reason)}"
            )
        for what, text in (("actor", self.actor), ("reason", self.reason)):
            if (why := unstorable(text)) is not None:
                raise ValueError(f"started_by() {what} {why}, which PostgreSQL cannot store: remove it")

    def start(self, subject: Model | None = None, *, idempotency_key: str | None = None, **arguments: Any) -> W:
        """:meth:`Workflow.start`, with this actor and reason on the run's ``started`` event."""
        from ..services.start import start_run  # deferred: this module loads before the app registry

        started = start_run(
            self.workflow,
            subject,
            idempotency_key=idempotency_key,
            arguments=arguments,
            actor=self.actor,
            reason=self.reason,
        )
        return cast(W, started)

    async def astart(self, subject: Model | None = None, *, idempotency_key: str | None = None, **arguments: Any) -> W:
        """:meth:`start`, awaited (as :meth:`Workflow.astart`)."""
        return await sync_to_async(self.start)(subject, idempotency_key=idempotency_key, **arguments)

    def start_many(self, items: Iterable[Model | Mapping[str, Any] | None]) -> list[W]:
        """:meth:`Workflow.start_many`, with this actor and reason on every run's ``started`` event."""
        from ..services.start import start_runs  # deferred: this module loads before the app registry

        return cast(list[W], start_runs(self.workflow, items, (self.actor, self.reason)))
