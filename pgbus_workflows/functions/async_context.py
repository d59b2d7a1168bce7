"""The ``ctx`` of an ``async def`` durable function, and its driver: the same calls, awaited.

The function is a coroutine the dispatcher awaits on its event loop, as it awaits async step
bodies (``dispatcher.coroutines``): it holds no thread while it awaits. Each call is the sync
``ctx``'s (``context.DurableContext``) with its database work sent to Django's database
thread (``sync_to_async``, as the async ORM's queries are): the same replay, checkpoint names,
options, records and exceptions. A checkpoint's body may be a plain callable, which runs on
that thread (its ORM calls work), or return an awaitable (an ``async def``, a ``lambda`` calling
one), which is awaited on the loop, cancelled past the checkpoint's ``timeout=`` as an async
step body is.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Iterable
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async

from ..exceptions import ConfigurationError
from ..services.payload import encode_payload
from .context import DurableContext, Stopped
from .driver import open_context, returned, stopped_at
from .options import checkpoint_definition


class AsyncDurableContext:
    """The ``ctx`` an ``async def`` durable function receives: ``await ctx.step(...)`` and the rest."""

    def __init__(self, ctx: DurableContext) -> None:
        self._ctx = ctx
        #: The call in flight: a function awaits its calls one at a time (their order is the replay's).
        self._busy: str | None = None

    @property
    def subject(self) -> Any:
        """The run's subject (a model instance, read before the function started), or None."""
        return self._ctx.subject

    @property
    def arguments(self) -> dict[str, Any]:
        """The run's arguments, as ``start`` stored them."""
        return self._ctx.arguments

    @property
    def workflow_id(self) -> str:
        """The run's ``workflow_id``."""
        return self._ctx.workflow_id

    @property
    def step_idempotency_key(self) -> str:
        """``<workflow_id>:<checkpoint>`` while a checkpoint's body runs: the same on every attempt."""
        return self._ctx.step_idempotency_key

    async def step(self, name: str, fn: Callable[[], Any], **options: Any) -> Any:
        """Run checkpoint ``name`` once: ``fn()``'s JSON return, recorded, then replayed on later runs.

        As ``DurableContext.step``. ``fn`` may be ``async def`` (or return an awaitable): it is
        awaited on the loop, and cancelled past ``timeout=`` (the attempt stalls, as an async
        step's). A plain ``fn`` runs on Django's database thread. ``atomic=True`` takes a plain
        ``fn`` only: Django's async ORM runs no transaction.
        """
        with self._one_at_a_time(f"ctx.step({name!r})"):
            ctx = self._ctx
            checkpoint = ctx._number(name)
            definition = checkpoint_definition(name, options)
            position = ctx._position
            if ctx._replayed(checkpoint):
                return ctx._recorded(position)
            if definition.atomic:
                return await sync_to_async(ctx._run)(checkpoint, definition, _plain(checkpoint, fn))
            from ..services.body import BodyTimedOut  # deferred: it imports the models, which the package root must not

            type(ctx._workflow).remember(definition)
            step = await sync_to_async(ctx._take)(checkpoint, definition, lazy=True)
            ctx._current = checkpoint
            try:
                output = await _called(checkpoint, fn, definition.timeout)
            except BodyTimedOut as timed_out:  # as an async step's: the attempt stalls (STALL_ACTION)
                raise Stopped(timed_out) from None
            except Exception as error:
                return await sync_to_async(ctx._failed)(step, checkpoint, definition, error)
            finally:
                ctx._current = None
            if ctx.shares_commit():  # recorded with the call's outcome: nothing to send now
                ctx._keep(step, checkpoint, output)
            else:
                await sync_to_async(ctx._record)(step, output)
            return output

    async def sleep(self, name: str, duration: timedelta | float) -> None:
        """Park the run for ``duration`` at checkpoint ``name``, as ``DurableContext.sleep``."""
        with self._one_at_a_time(f"ctx.sleep({name!r})"):
            await sync_to_async(self._ctx.sleep)(name, duration)

    async def wait_for(self, signal: str, timeout: timedelta | float | None = None) -> Any:
        """The payload of signal ``signal``, or None once ``timeout`` passes, as ``DurableContext.wait_for``."""
        with self._one_at_a_time(f"ctx.wait_for({signal!r})"):
            return await sync_to_async(self._ctx.wait_for)(signal, timeout)

    async def map(self, name: str, fn: Callable[[Any], Any], items: Iterable[Any], **options: Any) -> list[Any]:
        """One fan-out job per item; their results in order, as ``DurableContext.map``."""
        with self._one_at_a_time(f"ctx.map({name!r})"):
            return await sync_to_async(self._ctx.map)(name, fn, items, **options)

    async def child(self, name: str, cls: type, subject: Any = None, **arguments: Any) -> Any:
        """A child run of ``cls``, started once; its result, as ``DurableContext.child``."""
        with self._one_at_a_time(f"ctx.child({name!r})"):
            return await sync_to_async(self._ctx.child)(name, cls, subject, **arguments)

    def _one_at_a_time(self, call: str) -> _Busy:
        if self._busy is not None:
            raise ConfigurationError(
                f"{call} was awaited while {self._busy} was in flight: a durable function awaits its calls "
                "one at a time, in an order its replay meets again (ctx.map runs work side by side)"
            )
        return _Busy(self, call)


class _Busy:
    """Marks a call of ``ctx`` in flight for as long as it is awaited."""

    def __init__(self, ctx: AsyncDurableContext, call: str) -> None:
        self._ctx = ctx
        self._call = call

    def __enter__(self) -> None:
        self._ctx._busy = self._call

    def __exit__(self, *exc: object) -> None:
        self._ctx._busy = None


async def _called(checkpoint: str, fn: Callable[[], Any], timeout: timedelta | None) -> Any:
    """``fn()``'s return, encoded: an awaitable awaited here (bounded by ``timeout``).

    A plain ``fn`` is called on Django's database thread, as ``sync_to_async`` calls it.
    """
    from ..services.body import bounded  # deferred: it imports the models, which the package root must not

    value = fn() if inspect.iscoroutinefunction(fn) else await sync_to_async(fn)()
    if inspect.isawaitable(value):
        value = await bounded(value, timeout)
    return None if value is None else encode_payload(value, f"{checkpoint} output")


def _plain(checkpoint: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` as an atomic checkpoint's body; ``ConfigurationError`` for one that is ``async`` (no transaction)."""
    message = (
        f"ctx.step({checkpoint!r}, atomic=True) takes a plain callable: Django's async ORM runs no transaction. "
        "Drop atomic=True, or pass a sync function (it runs on Django's database thread, in the transaction)"
    )
    if inspect.iscoroutinefunction(fn):
        raise ConfigurationError(message)

    def body() -> Any:
        value = fn()
        if inspect.isawaitable(value):
            close = getattr(value, "close", None)
            if close is not None:
                close()  # never awaited: no "coroutine was never awaited" warning on top of the error
            raise ConfigurationError(message)
        return value

    return body


def drive(workflow: Any) -> Coroutine[Any, Any, Any]:
    """The body of every row of a durable class of an ``async def``: its coroutine, awaited on the loop.

    The recorded checkpoints and the subject are read here, on the worker's thread (the
    coroutine may not query but through ``sync_to_async``). The coroutine ends as
    ``driver.drive`` does: the run's result, an error for the engine's policies, or nothing
    left to apply.
    """
    ctx = open_context(workflow)
    context = ctx._context
    context.drives_function = True
    _ = workflow.subject
    return _run(workflow, ctx)


async def _run(workflow: Any, ctx: DurableContext) -> Any:
    try:
        value = await type(workflow).function(AsyncDurableContext(ctx), **workflow.arguments)
    except Stopped as stopped:
        return stopped_at(workflow, ctx._context, stopped)
    except Exception:  # not a cancellation: awaiting more then would only delay it
        if ctx._pending is None:
            raise
        try:  # the function's own error, past a checkpoint still to record: recorded first, as it went
            await sync_to_async(ctx.record_pending)()
        except Stopped as stopped:
            return stopped_at(workflow, ctx._context, stopped)
        raise
    returned(workflow, ctx, value)
