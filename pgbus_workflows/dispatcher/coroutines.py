"""The dispatcher's event loop: ``async def`` bodies and jobs await on it, holding no thread.

A worker thread runs an attempt's guards and calls its body; an ``async def`` body gives back
a coroutine (``services.body.Awaiting``), which the worker submits here and goes on to other
work. Up to ``capacity`` coroutines await at once (``--async-concurrency``, the setting
``ASYNC_CONCURRENCY``); when all are taken the worker awaits the body itself, as it would
without this loop, so a claimed body never waits unstarted. A coroutine's end goes back to
the worker pool (``on_settled``), whose threads write its outcome with their batches.

The ORM calls a body awaits run, as Django's async ORM does outside a request, one at a time on
asgiref's single database thread (one connection); its connection is closed with the loop.

A body that runs for ``SLOW_SECONDS`` or more without awaiting (a ``time.sleep``, a blocking
client) holds every other coroutine up: each such stretch is logged as a warning naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from ..services.body import Awaiting, bounded
from .lanes import Claim, Settled, work_key

logger = logging.getLogger("pgbus_workflows")

#: A stretch of a body without an await this long is logged (asyncio's own slow-callback threshold).
SLOW_SECONDS = 0.1


class CoroutineLoop:
    """An event loop on a thread of its own, awaiting up to ``capacity`` bodies at once."""

    def __init__(
        self, capacity: int, on_settled: Callable[[Settled], None], on_dropped: Callable[[Claim], None]
    ) -> None:
        self.capacity = capacity
        self._on_settled = on_settled
        #: Called for a body cancelled at shutdown: its claim is given up, not written.
        self._on_dropped = on_dropped
        self._cancelled = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="pgbus-coroutines", daemon=True)
        self._lock = threading.Lock()
        #: work_key of every body submitted and not yet ended, with its task once it has one.
        self._in_flight: dict[tuple[str, int], asyncio.Task[None] | None] = {}
        self._open = True

    def start(self) -> None:
        """Start the loop's thread."""
        self._thread.start()

    def in_flight(self) -> int:
        """How many bodies await on the loop."""
        return len(self._in_flight)

    def full(self) -> bool:
        """Whether every one of ``capacity`` places is taken."""
        return len(self._in_flight) >= self.capacity

    def submit(self, work: Claim, awaiting: Awaiting[Any]) -> bool:
        """Await ``awaiting``'s coroutine on the loop; False (nothing done) when the loop is full or closed."""
        with self._lock:
            if not self._open or len(self._in_flight) >= self.capacity:
                return False
            self._in_flight[work_key(work)] = None
        self._loop.call_soon_threadsafe(self._begin, work, awaiting)
        return True

    def close(self, *, cancel: bool, timeout: float = 5.0) -> None:
        """Take no more bodies; cancel those still awaiting when ``cancel``; stop the loop's thread.

        The dispatcher cancels only after its shutdown grace, once their attempts are stalled.
        """
        with self._lock:
            self._open = False
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._stop, cancel)
        self._thread.join(timeout)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _begin(self, work: Claim, awaiting: Awaiting[Any]) -> None:
        task = self._loop.create_task(self._drive(work, awaiting), name=awaiting.label, context=awaiting.context)
        with self._lock:
            key = work_key(work)
            if key in self._in_flight:
                self._in_flight[key] = task

    async def _drive(self, work: Claim, awaiting: Awaiting[Any]) -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = await bounded(_Timed(awaiting.coroutine, awaiting.label), awaiting.timeout)
        except asyncio.CancelledError as cancelled:
            if self._cancelled:  # at shutdown, past the grace: the dispatcher stalls its attempt
                self._forget(work)
                self._on_dropped(work)
                return
            error = cancelled  # the body's own: its end is written like any other
        except BaseException as raised:
            error = raised
            # A connection that failed under the body is replaced before the next body uses it.
            with contextlib.suppress(Exception):
                await sync_to_async(close_old_connections)()
        self._forget(work)
        self._on_settled(Settled(work, awaiting, value, error))

    def _forget(self, work: Claim) -> None:
        with self._lock:
            self._in_flight.pop(work_key(work), None)

    def _stop(self, cancel: bool) -> None:
        tasks = [task for task in self._in_flight.values() if task is not None]
        if cancel:
            self._cancelled = True
            for task in tasks:
                task.cancel()

        async def wind_up() -> None:
            if cancel:
                await asyncio.gather(*tasks, return_exceptions=True)
            await sync_to_async(connections.close_all)()
            self._loop.stop()

        self._loop.create_task(wind_up())


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
