"""Durable functions that dispatcher processes run in the process tests (``tests/functions``)."""

import asyncio
import time
from datetime import timedelta

from pgbus_workflows import Workflow, durable, step
from tests.testapp.jobs import blocks_until_released, square
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


class Doubler(Workflow):
    """A step class as a durable function's child: doubles ``n``, or cancels itself when ``cancel``."""

    name = "durable_doubler"
    allow_multiple = True

    @step
    def double(self):
        SideEffect.objects.create(label="double", key=str(self.arguments["n"]))
        if self.arguments.get("cancel"):
            self.cancel("asked to")
        self.finished(self.arguments["n"] * 2)


@durable(name="durable_tripler", allow_multiple=True)
def durable_tripler(ctx, n):
    """A durable function as a child: triples ``n`` in a checkpoint."""
    return ctx.step("triple", _noted("triple", n * 3))


@durable(name="durable_gather", allow_multiple=True)
def durable_gather(ctx, numbers):
    """A map of ``square`` over ``numbers``, then a child of each kind; returns what they gave."""
    squares = ctx.map("squares", square, numbers)
    doubled = ctx.child("double", Doubler, None, n=sum(squares))
    tripled = ctx.child("triple", durable_tripler, None, n=doubled)
    return {"squares": squares, "doubled": doubled, "tripled": tripled}


@durable(name="durable_map_killed", allow_multiple=True)
def durable_map_killed(ctx):
    """A checkpoint, then a map whose job blocks until released (its dispatcher is killed meanwhile)."""
    ctx.step("before", _noted("before", 1))
    return ctx.map("work", blocks_until_released, ["a", "b"])


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


async def _awaited_note(label, value):
    """An ``async def`` checkpoint body: awaits, records ``label`` through the async ORM, returns ``value``."""
    await asyncio.sleep(0.01)
    await SideEffect.objects.acreate(label=label)
    return value


@durable(name="durable_async_journey", allow_multiple=True)
async def durable_async_journey(ctx, pages):
    """The journey as an ``async def``: async and plain checkpoints, a sleep, a wait for ``go``, a map, a child."""
    total = 0
    for n in range(pages):
        total += await ctx.step("page", lambda n=n: _awaited_note(f"async page {n}", n))
    await ctx.step("plain", _noted("plain", None))
    await ctx.sleep("breathe", timedelta(seconds=1))
    go = await ctx.wait_for("go", timeout=timedelta(minutes=5))
    squares = await ctx.map("squares", square, [1, 2])
    tripled = await ctx.child("triple", durable_tripler, None, n=total)
    return {"total": total, "go": go, "squares": squares, "tripled": tripled}


async def _awaits_until_released():
    """Records ``async blocking``, then awaits until the test writes ``release`` (it kills the dispatcher first)."""
    await SideEffect.objects.acreate(label="async blocking")
    while not await SideEffect.objects.filter(label="release").aexists():
        await asyncio.sleep(0.05)
    return "released"


@durable(name="durable_async_killed", allow_multiple=True)
async def durable_async_killed(ctx):
    """A checkpoint, then an async one that awaits until released, then one more."""
    await ctx.step("before", _noted("before", 1))
    await ctx.step("blocking", _awaits_until_released)
    return await ctx.step("after", _noted("after", "done"))
