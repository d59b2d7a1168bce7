"""The async twins of what a view calls: ``astart``, ``afind``, ``asignal_for``, ``asignal``, ``aresult``.

An async view awaits them as it would any coroutine, without wrapping them itself. Each runs its
sync twin through asgiref's ``sync_to_async``: the same rules, the same errors, the same rows.
The quick ones run thread-sensitively (Django's default): on the one thread that runs the
server's other sync code, with its connection, as a sync view's calls would. ``aresult`` may
wait for minutes, so it waits on a thread of its own instead (not blocking every other sync
call of the server meanwhile), and closes the connection it opened there when it returns.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self

from asgiref.sync import sync_to_async
from django.db import connections

if TYPE_CHECKING:
    from django.db.models import Model

    from ..models import WorkflowSignal


class AsyncCalls:
    """``await Cls.astart(...)``, ``await Cls.afind(...)``, ``await Cls.asignal_for(...)``, ``await wf.asignal(...)``,
    ``await wf.aresult(...)``: the async half of ``Workflow``.
    """

    @classmethod
    async def astart(
        cls, subject: Model | None = None, *, idempotency_key: str | None = None, **arguments: Any
    ) -> Self:
        """:meth:`Workflow.start`, awaited."""
        start = cls.start  # type: ignore[attr-defined]
        return await sync_to_async(start)(subject, idempotency_key=idempotency_key, **arguments)  # type: ignore[no-any-return]

    @classmethod
    async def afind(cls, workflow_id: Any) -> Self | None:
        """:meth:`Workflow.find`, awaited."""
        return await sync_to_async(cls.find)(workflow_id)  # type: ignore[attr-defined,no-any-return]

    @classmethod
    async def asignal_for(
        cls,
        subject: Model,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
        missing: str = "raise",
        actor: str | None = None,
        reason: str | None = None,
    ) -> WorkflowSignal | None:
        """:meth:`Workflow.signal_for`, awaited."""
        signal_for = cls.signal_for  # type: ignore[attr-defined]
        return await sync_to_async(signal_for)(  # type: ignore[no-any-return]
            subject, name, payload, idempotency_key, missing=missing, actor=actor, reason=reason
        )

    async def asignal(
        self,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
        *,
        actor: str | None = None,
        reason: str | None = None,
    ) -> WorkflowSignal:
        """:meth:`Workflow.signal`, awaited."""
        signal = self.signal  # type: ignore[attr-defined]
        return await sync_to_async(signal)(  # type: ignore[no-any-return]
            name, payload, idempotency_key, actor=actor, reason=reason
        )

    async def aresult(self, timeout: float | timedelta | None = None) -> Any:
        """:meth:`Workflow.result`, awaited: waits on a thread of its own, not the server's shared one."""

        def wait() -> Any:
            try:
                return self.result(timeout)  # type: ignore[attr-defined]
            finally:
                connections.close_all()  # this thread's own: the next wait may run on another

        return await sync_to_async(wait, thread_sensitive=False)()
