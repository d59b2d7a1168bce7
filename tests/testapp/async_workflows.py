"""Workflow classes with ``async def`` bodies (imported by ``workflows``, so dispatchers know them)."""

import asyncio
import ssl
import threading
import time
from pathlib import Path

from pgbus_workflows import Workflow, step

from .models import SideEffect


class AsyncPing(Workflow):
    """Two async steps: one awaits (a stand-in for an HTTP call) and the ORM, the next reads its output."""

    name = "async_ping"
    allow_multiple = True

    @step
    async def call(self):
        await asyncio.sleep(self.arguments.get("seconds", 0.05))
        await SideEffect.objects.acreate(label="async-ping", key=str(self.workflow_id))
        return {"pong": self.arguments.get("n")}

    @step
    async def record(self):
        return self.outputs["call"]


class Gate:
    """For tests of the dispatcher's event loop: bodies that entered, those cancelled, and the
    event that lets them all end (in-process only)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.opened = threading.Event()
        self.entered = set()
        self.cancelled = set()

    async def wait(self, name):
        self.entered.add(name)
        try:
            while not self.opened.is_set():
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.cancelled.add(name)
            raise


GATE = Gate()


async def gated_job(n):
    """A fan-out job that awaits :data:`GATE`."""
    await GATE.wait(f"job-{n}")
    return n * 10


class FileGated(Workflow):
    """An async step that awaits until the file its arguments name exists (for dispatcher processes)."""

    name = "async_file_gated"
    allow_multiple = True

    @step
    async def call(self):
        await SideEffect.objects.acreate(label="file-gated-began", key=str(self.workflow_id))
        gate = Path(self.arguments["gate"])
        while not gate.exists():
            await asyncio.sleep(0.05)
        return {"n": self.arguments.get("n")}

    @step
    def record(self):
        return self.outputs["call"]["n"]


class BlocksTheLoop(Workflow):
    """An async body that blocks the event loop (a sync sleep) instead of awaiting."""

    name = "async_blocks_the_loop"

    @step
    async def blocks(self):
        time.sleep(0.3)  # the mistake this class is about
        return "done"


class AwaitsIO(Workflow):
    """One async step awaiting simulated I/O (``bench.async_bodies``)."""

    name = "async_awaits_io"
    allow_multiple = True

    @step
    async def call(self):
        await asyncio.sleep(self.arguments["seconds"])


class SleepsIO(Workflow):
    """The same step blocking a thread instead (``bench.async_bodies``' baseline)."""

    name = "async_sleeps_io"
    allow_multiple = True

    @step
    def call(self):
        time.sleep(self.arguments["seconds"])


def _on_loop_shutdown(close):
    """``on_loop_shutdown``, imported when called: a benchmark loads this app into an older dispatcher."""
    from pgbus_workflows.dispatcher import on_loop_shutdown

    on_loop_shutdown(close)


class SharedClient:
    """A module-level async client, as HTTP libraries ask for: one connection, opened on first use.

    Its stream and lock belong to the event loop that first used them: a body on any other
    loop fails (``RuntimeError``), as an ``httpx.AsyncClient`` shared across loops does.
    """

    def __init__(self):
        self.forget()

    def forget(self):
        """Drop the connection (it belonged to a loop now closed: another test's dispatcher)."""
        self._connection = None
        self._lock = None
        self.closed = False

    async def aclose(self):
        """Close the connection (the dispatcher awaits it as its loop stops)."""
        if self._connection is not None:
            self._connection[1].close()
        self.closed = True

    async def echo(self, port, line):
        """Send ``line`` to the echo server on ``port``; what it sends back."""
        if self._connection is None:
            self._lock = asyncio.Lock()
            self._connection = await asyncio.open_connection("127.0.0.1", port)
            _on_loop_shutdown(self.aclose)
        reader, writer = self._connection
        async with self._lock:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            return (await reader.readline()).decode().strip()


SHARED_CLIENT = SharedClient()


class UsesSharedClient(Workflow):
    """An async step calling an echo server through :data:`SHARED_CLIENT`, one module-level client."""

    name = "async_uses_shared_client"
    allow_multiple = True

    @step
    async def call(self):
        await asyncio.sleep(0.01)  # bodies overlap: the client is contended
        return await SHARED_CLIENT.echo(self.arguments["port"], str(self.arguments["n"]))


class EchoServer:
    """A line echo server on 127.0.0.1 (its own loop on a thread), for :class:`UsesSharedClient`."""

    def __init__(self):
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def __enter__(self):
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self):
        async def echo(reader, writer):
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
            writer.close()

        server = self._loop.run_until_complete(asyncio.start_server(echo, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()


class NeverReturns(Workflow):
    """An async step without ``timeout=`` that awaits forever (until cancelled)."""

    name = "async_never_returns"
    allow_multiple = True

    @step
    async def call(self):
        await SideEffect.objects.acreate(label="never-returns-began", key=str(self.workflow_id))
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await SideEffect.objects.acreate(label="never-returns-cancelled", key=str(self.workflow_id))
            raise


class SwallowsCancel(Workflow):
    """An async step that swallows its cancellation and awaits on (the mistake this class is about)."""

    name = "async_swallows_cancel"
    allow_multiple = True

    @step
    async def call(self):
        await SideEffect.objects.acreate(label="swallows-began", key=str(self.workflow_id))
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue


class PooledClient:
    """A small async client with a pool of connections, as an HTTP client keeps (``bench.async_bodies``).

    Made, it builds a TLS context, as ``httpx.AsyncClient()`` does (reading the system's CA
    certificates: blocking, on the loop); each call takes an idle connection or opens one.
    """

    def __init__(self):
        self.tls = ssl.create_default_context()
        self._idle = []

    async def call(self, port, line):
        """Send ``line`` to the server on ``port``; its answer."""
        reader, writer = self._idle.pop() if self._idle else await asyncio.open_connection("127.0.0.1", port)
        writer.write(line.encode() + b"\n")
        await writer.drain()
        answer = (await reader.readline()).decode().strip()
        self._idle.append((reader, writer))
        return answer

    async def aclose(self):
        """Close every connection."""
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


#: The module-level client: made on first use (on the dispatcher's one loop), closed at exit.
_pooled = None


def pooled_client():
    """The process's one :class:`PooledClient`, made on first use."""
    global _pooled
    if _pooled is None:
        _pooled = PooledClient()
        _on_loop_shutdown(_pooled.aclose)
    return _pooled


class CallsShared(Workflow):
    """One async step calling the server through the module-level client (``bench.async_bodies``)."""

    name = "async_calls_shared"
    allow_multiple = True

    @step
    async def call(self):
        return await pooled_client().call(self.arguments["port"], "x")


class CallsPerStep(Workflow):
    """The same call through a client made and closed by the step (``bench.async_bodies``' baseline)."""

    name = "async_calls_per_step"
    allow_multiple = True

    @step
    async def call(self):
        client = PooledClient()
        try:
            return await client.call(self.arguments["port"], "x")
        finally:
            await client.aclose()
