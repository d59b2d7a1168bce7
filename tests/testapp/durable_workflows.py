"""Durable functions that dispatcher processes run in the process tests (``tests/functions``)."""

import time
from datetime import timedelta

from pgbus_workflows import durable
from tests.testapp.models import SideEffect


def _noted(label, value):
    """A checkpoint body: records ``label`` in the side effects table and returns ``value``."""

    def body():
        SideEffect.objects.create(label=label)
        return value

    return body


@durable(name="durable_journey", allow_multiple=True)
def durable_journey(ctx, pages):
    """A loop of checkpoints, a short sleep and a wait for the signal ``go``; returns the sum and the payload."""
    total = sum(ctx.step("page", _noted(f"page {n}", n)) for n in range(pages))
    ctx.sleep("breathe", timedelta(seconds=1))
    go = ctx.wait_for("go", timeout=timedelta(minutes=5))
    return {"total": total, "go": go}


def _blocks_until_released():
    """Records ``blocking``, then waits until the test writes ``release`` (the test kills its dispatcher first)."""
    SideEffect.objects.create(label="blocking")
    while not SideEffect.objects.filter(label="release").exists():
        time.sleep(0.05)
    return "released"


@durable(name="durable_killed", allow_multiple=True)
def durable_killed(ctx):
    """A checkpoint, then one whose body blocks until released, then one more."""
    ctx.step("before", _noted("before", 1))
    ctx.step("blocking", _blocks_until_released)
    return ctx.step("after", _noted("after", "done"))


def _nothing():
    """An empty checkpoint body: the benchmarks measure the engine, not the bodies."""
    return None


@durable(name="durable_noop3", allow_multiple=True)
def durable_noop3(ctx):
    """Three empty checkpoints: ``bench.durable``'s match for ``NoOp3``'s three empty steps."""
    ctx.step("a", _nothing)
    ctx.step("b", _nothing)
    ctx.step("c", _nothing)


@durable(name="durable_long", allow_multiple=True)
def durable_long(ctx, checkpoints, park_every):
    """``checkpoints`` empty checkpoints, parking (a sleep of 0) after every ``park_every``: each park replays them."""
    for n in range(checkpoints):
        ctx.step("c", _nothing)
        if (n + 1) % park_every == 0:
            ctx.sleep("park", 0)
    return checkpoints
