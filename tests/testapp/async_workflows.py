"""Workflow classes with ``async def`` bodies (imported by ``workflows``, so dispatchers know them)."""

import asyncio

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
