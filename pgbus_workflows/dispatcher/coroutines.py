"""The dispatcher's event loop: every ``async def`` body and job of the process awaits on it.

A worker thread runs an attempt's guards and calls its body; an ``async def`` body gives back
a coroutine (``services.body.Awaiting``), which the worker submits here. Up to ``capacity``
coroutines await at once holding no thread (``--async-concurrency``, the setting
``ASYNC_CONCURRENCY``), and the worker goes on to other work; when all those places are taken
(always, with a capacity of 0) the worker hands its coroutine to the same loop and waits for
its end, as it would for a plain body. A claimed body thus starts at once, and always on this
one long-lived loop: a module-level async client (bound to the loop that first used it) works
for every body. A coroutine's end goes back to the worker pool (``on_settled``), whose threads
write its outcome with their batches.

The ORM calls a body awaits run, as Django's async ORM does outside a request, one at a time on
asgiref's single database thread (one connection); its connection is closed with the loop.

A body that runs for ``SLOW_SECONDS`` or more without awaiting (a ``time.sleep``, a blocking
client) holds every other coroutine up: each such stretch is logged as a warning naming it.

A body whose attempt was stalled meanwhile is cancelled (:meth:`CoroutineLoop.cancel`) and
leaves the loop, its place freed; one that has not ended ``CANCEL_GRACE`` seconds after its
cancellation (it swallows ``CancelledError``) is logged, runs on uncounted, and its end is ignored;
its coroutine is closed when the loop stops.

What bodies registered with :func:`on_loop_shutdown` is awaited on the loop as it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from ..services.body import Awaiting, bounded
from .lanes import Claim, Settled, work_key
from .waker import join_until

logger = logging.getLogger("pgbus_workflows")

#: A stretch of a body without an await this long is logged (asyncio's own slow-callback threshold).
SLOW_SECONDS = 0.1
#: How long a cancelled body has to end before it is taken for one that will not (and uncounted).
CANCEL_GRACE = 5.0

#: What each dispatcher's loop awaits when it stops (:func:`on_loop_shutdown`), by loop.
_closers: dict[asyncio.AbstractEventLoop, list[Callable[[], Awaitable[Any]]]] = {}


def on_loop_shutdown(close: Callable[[], Awaitable[Any]]) -> None:
    """Await ``close()`` on the dispatcher's event loop when the dispatcher stops (a module-level client's ``aclose``).

    Call it from an ``async def`` body (where the client is made on first use). Outside a
    dispatcher's loop (the test helpers await a body on a loop of their own) it does nothing.
    """
    loop = asyncio.get_running_loop()
    if loop in _closers:
        _closers[loop].append(close)


@dataclass(eq=False)
class _Body:
    """A coroutine on the loop: its claim, where its end goes, whether it holds a place."""

    work: Claim
    awaiting: Awaiting[Any]
    #: Called once with its end, or with None when it is dropped (cancelled, not written).
    deliver: Callable[[Settled | None], None]
    #: Whether it takes one of ``capacity`` places (False: a worker thread waits for it).
    counted: bool
    task: asyncio.Task[None] | None = None
    #: Why it was cancelled by the dispatcher ("" while it was not): its end is then dropped.
    cancelled: str = ""
    delivered: bool = field(default=False)


class CoroutineLoop:
    """An event loop on a thread of its own: ``capacity`` bodies await on it holding no thread, any number held."""

    def __init__(
        self, capacity: int, on_settled: Callable[[Settled], None], on_dropped: Callable[[Claim], None]
    ) -> None:
        self.capacity = capacity
        self._on_settled = on_settled
        #: Called for a body cancelled by the dispatcher: its claim is given up, not written.
        self._on_dropped = on_dropped
        self._loop = asyncio.new_event_loop()
        _closers[self._loop] = []
        self._thread = threading.Thread(target=self._serve, name="pgbus-coroutines", daemon=True)
        self._lock = threading.Lock()
        #: work_key of every body on the loop and not yet ended (nor given up as unending).
        self._bodies: dict[tuple[str, int], _Body] = {}
        self._counted = 0
        #: Cancelled bodies that would not end: kept referenced (a task nobody holds may vanish).
        self._unending: set[asyncio.Task[None]] = set()
        self._open = True

    def start(self) -> None:
        """Start the loop's thread."""
        self._thread.start()

    def in_flight(self) -> int:
        """How many bodies await on the loop holding no worker thread."""
        return self._counted

    def full(self) -> bool:
        """Whether every one of ``capacity`` places is taken."""
        return self._counted >= self.capacity

    def claims(self) -> list[Claim]:
        """The claims whose bodies are on the loop (counted or held by a worker)."""
        with self._lock:
            return [body.work for body in self._bodies.values()]

    def submit(self, work: Claim, awaiting: Awaiting[Any]) -> bool:
        """Await ``awaiting``'s coroutine on the loop in one of its places; False (nothing done) when full or closed."""
        with self._lock:
            if not self._open or self._counted >= self.capacity:
                return False
            self._counted += 1
            body = self._bodies[work_key(work)] = _Body(work, awaiting, self._hand_on(work), counted=True)
        self._loop.call_soon_threadsafe(self._begin, body)
        return True

    def await_held(self, work: Claim, awaiting: Awaiting[Any]) -> Settled | None:
        """Await the coroutine on the loop beyond its places, the calling worker waiting for its end.

        None when it was dropped (cancelled as stalled, or the loop is closed): its claim is given up.
        """
        ended: Future[Settled | None] = Future()
        with self._lock:
            if not self._open:
                _close(awaiting)
                return None
            body = self._bodies[work_key(work)] = _Body(work, awaiting, ended.set_result, counted=False)
        self._loop.call_soon_threadsafe(self._begin, body)
        return ended.result()

    def cancel(self, keys: Iterable[tuple[str, int]], why: str) -> int:
        """Cancel the bodies of these claims (their attempts stalled); how many there were."""
        with self._lock:
            bodies = [self._bodies[key] for key in keys if key in self._bodies]
        for body in bodies:
            self._loop.call_soon_threadsafe(self._cancel, body, why)
        return len(bodies)

    def close(self, *, cancel: bool, timeout: float = 5.0) -> None:
        """Take no more bodies; cancel those still awaiting when ``cancel``; stop the loop's thread.

        The dispatcher cancels only after its shutdown grace, once their attempts are stalled.
        """
        with self._lock:
            self._open = False
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._stop, cancel, timeout)
        join_until(self._thread, time.monotonic() + timeout + 1.0)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            _closers.pop(self._loop, None)
            for task in asyncio.all_tasks(self._loop):
                _close_left(task)
            self._loop.close()

    def _hand_on(self, work: Claim) -> Callable[[Settled | None], None]:
        def deliver(settled: Settled | None) -> None:
            if settled is None:
                self._on_dropped(work)
            else:
                self._on_settled(settled)

        return deliver

    def _begin(self, body: _Body) -> None:
        awaiting = body.awaiting
        body.task = self._loop.create_task(self._drive(body), name=awaiting.label, context=awaiting.context)

    async def _drive(self, body: _Body) -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = await bounded(_Timed(body.awaiting.coroutine, body.awaiting.label), body.awaiting.timeout)
        except asyncio.CancelledError as cancelled:
            if body.cancelled:  # by the dispatcher: its attempt was stalled, it is not written
                self._end(body, None)
                return
            error = cancelled  # the body's own: its end is written like any other
        except GeneratorExit:
            # Closed, not raised: it may run anywhere (a collected task), so it awaits nothing.
            self._end(body, None)
            raise
        except BaseException as raised:
            error = raised
            # A connection that failed under the body is replaced before the next body uses it.
            with contextlib.suppress(Exception):
                await sync_to_async(close_old_connections)()
        self._end(body, None if body.cancelled else Settled(body.work, body.awaiting, value, error))

    def _end(self, body: _Body, settled: Settled | None) -> None:
        """Free the body's place and deliver its end, once (an unending one was delivered already)."""
        if body.delivered:
            if body.task is not None:
                self._unending.discard(body.task)
            return
        body.delivered = True
        with self._lock:
            if self._bodies.get(work_key(body.work)) is body:
                del self._bodies[work_key(body.work)]
            if body.counted:
                self._counted -= 1
        body.deliver(settled)

    def _cancel(self, body: _Body, why: str) -> None:
        if body.delivered or body.task is None or body.cancelled:
            return
        body.cancelled = why
        body.task.cancel()
        self._loop.call_later(CANCEL_GRACE, self._give_up, body)

    def _give_up(self, body: _Body) -> None:
        """A cancelled body still running: it swallowed its cancellation. Uncounted from now on."""
        if body.delivered or body.task is None or body.task.done():
            return
        logger.error(
            "%s did not end %.0fs after it was cancelled (%s): it swallows CancelledError. "
            "It runs on, no longer counted against the event loop's places, and its end is ignored.",
            body.awaiting.label,
            CANCEL_GRACE,
            body.cancelled,
        )
        self._unending.add(body.task)
        self._end(body, None)

    def _stop(self, cancel: bool, timeout: float) -> None:
        with self._lock:
            bodies = list(self._bodies.values())
        if cancel:
            for body in bodies:
                self._cancel(body, "shutdown")

        async def wind_up() -> None:
            tasks = [body.task for body in bodies if body.task is not None]
            if cancel and tasks:
                await asyncio.wait(tasks, timeout=timeout)
                for body in bodies:
                    self._end(body, None)  # those that would not end: their claims are given up
            for close in _closers.pop(self._loop, []):
                try:
                    await asyncio.wait_for(close(), timeout)
                except Exception:
                    logger.exception("Closing %r when the event loop stopped failed", close)
            await sync_to_async(connections.close_all)()
            self._loop.stop()

        self._loop.create_task(wind_up())


def _close_left(task: asyncio.Task[Any]) -> None:
    """Close the coroutine of a task its stopped loop left pending (a body that would not end).

    Here and now, on the loop's own thread: left to the garbage collector, it would run its
    ``finally`` blocks wherever the task is collected, in another body's context.
    """
    try:
        task.get_coro().close()
    except RuntimeError:
        logger.exception("%s would not close when the event loop stopped", task.get_name())


def _close(awaiting: Awaiting[Any]) -> None:
    """Close a coroutine that will never be awaited (no "never awaited" warning)."""
    close = getattr(awaiting.coroutine, "close", None)
    if close is not None:
        close()


class _Timed:
    """Awaits a body's coroutine, timing each stretch it runs without awaiting (the loop waits meanwhile)."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any] | Any, label: str) -> None:
        self._coroutine = coroutine.__await__() if not hasattr(coroutine, "send") else coroutine
        self._label = label

    def __await__(self) -> Generator[Any, None, Any]:
        return self

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        """Resume the body with ``value``."""
        return self._timed(self._coroutine.send, value)

    def throw(self, *error: Any) -> Any:
        """Resume the body with an exception (a cancellation, a timeout)."""
        return self._timed(self._coroutine.throw, *error)

    def close(self) -> None:
        """Close the body's coroutine."""
        self._coroutine.close()

    def _timed(self, resume: Callable[..., Any], *arguments: Any) -> Any:
        began = time.perf_counter()
        try:
            return resume(*arguments)
        finally:
            held = time.perf_counter() - began
            if held >= SLOW_SECONDS:
                logger.warning(
                    "%s held the event loop for %.2fs without awaiting: every other async body waited. "
                    "Await instead of blocking (asyncio.sleep, an async client), or wrap the blocking "
                    "call in asgiref's sync_to_async.",
                    self._label,
                    held,
                )
