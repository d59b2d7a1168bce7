"""Durable functions whose checkpoints run on other queues, for the process tests (``tests/functions``)."""

import os

from pgbus_workflows import Concurrency, durable
from tests.testapp.models import SideEffect

#: The queue the routed checkpoint runs on (a dispatcher of its own in the tests).
SLOW_QUEUE = "durable_slow"


def _in_process(label):
    """A checkpoint body: records ``label`` with this process's pid as the key; returns the pid."""

    def body():
        SideEffect.objects.create(label=label, key=str(os.getpid()))
        return os.getpid()

    return body


@durable(name="durable_routed_processes", allow_multiple=True)
def durable_routed_processes(ctx):
    """A checkpoint on the default queue, one on :data:`SLOW_QUEUE` under a key, then one more."""
    here = ctx.step("here", _in_process("here"))
    there = ctx.step(
        "there", _in_process("there"), queue=SLOW_QUEUE, concurrency=Concurrency(key="routed-slow", limit=1)
    )
    back = ctx.step("back", _in_process("back"))
    return {"here": here, "there": there, "back": back}
