"""Workflow classes with ``async def`` bodies (imported by ``workflows``, so dispatchers know them)."""

import asyncio
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
