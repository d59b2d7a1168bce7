"""Async bodies (issue #38): what awaiting on the dispatcher's event loop buys, costs in memory, and costs the rest.

    .venv/bin/python -m bench.async_bodies [--runs 1000] [--seconds 1] [--repeat 7] [--quick]

Measured in this one run on this machine, in a database of its own made anew for each
measurement:

- **wall time**: ``--runs`` ``AwaitsIO`` runs, whose one ``async def`` step awaits
  ``asyncio.sleep(--seconds)`` (simulated I/O), started before one dispatcher
  ``--concurrency 4`` (the default ``ASYNC_CONCURRENCY``, 100) drains them; then the same runs
  of ``SleepsIO``, whose plain step calls ``time.sleep(--seconds)``. Wall time is from the
  first body's start to the last one's end; the serial time is runs x seconds. The expected
  async wall time is serial / (100 + 4): a hundred bodies await on the loop, and when it is
  full the four threads await one each.
- **memory**: one dispatcher with ``--async-concurrency`` equal to ``--runs``; its RSS at rest
  (registered, nothing claimed), then the largest while all ``--runs`` bodies await at once
  (each awaits long enough to be counted), as MB and KB per awaiting body.
- **the trickle of plain runs**: ``bench.trickle``'s trickle (a client starts ``NoOp3`` runs one
  transaction each while one dispatcher of four drains them), with the event loop off
  (``ASYNC_CONCURRENCY`` 0, the baseline) and on (100): steps/s, paired by repetition in an
  alternating order, with the median ratio's sign-test interval.

- **one client per process or one per step**: ``--client-runs`` runs whose one ``async def``
  step calls a server this process starts on 127.0.0.1 (it answers each call after one
  second), one dispatcher of four: ``CallsShared`` through a module-level client made on
  first use (closed with ``on_loop_shutdown``), ``CallsPerStep`` through a client each step
  makes and closes. The client (``tests.testapp.async_workflows.PooledClient``) builds a TLS
  context when made, as ``httpx.AsyncClient()`` does, and keeps a pool of connections. Wall
  time from the first body's start to the last one's end, paired by repetition in an
  alternating order; the median ratio per step / shared with its sign-test interval.

``--quick`` shrinks every size (a smoke run, not figures to publish).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable

from bench import rss
from bench.common import (
    SETTLE_SECONDS,
    recreate_database,
    start_dispatchers,
    stop,
    wait_registered,
    wait_until,
)
from bench.intervals import described, no_slower
from bench.limits import paired


def wall_seconds(class_name: str, runs: int, seconds: float) -> float:
    """Seconds from the first body's start to the last one's end: ``runs`` runs, one dispatcher of four."""
    from django.db.models import Max, Min

    from pgbus_workflows.dsl.declared import registry
    from pgbus_workflows.models import WorkflowRun, WorkflowStep

    recreate_database()
    cls = registry.get(class_name)
    assert cls is not None, class_name
    cls.start_many([{"arguments": {"seconds": seconds}} for _ in range(runs)])
    processes = start_dispatchers(1, 4)
    try:
        finished = WorkflowRun.objects.filter(workflow_class=class_name, status="finished")
        wait_until(lambda: finished.count() >= runs, runs * seconds + 600, f"{runs} {class_name} runs")
    finally:
        stop(processes)
    span = WorkflowStep.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return (span["last"] - span["first"]).total_seconds()


def memory(runs: int) -> tuple[float, float]:
    """``(MB at rest, largest MB while runs bodies await at once)`` of one dispatcher whose loop takes them all."""
    from pgbus_workflows.models import WorkflowStep
    from tests.testapp.async_workflows import AwaitsIO

    recreate_database()
    [process] = start_dispatchers(1, 4, {"ASYNC_CONCURRENCY": runs})
    try:
        wait_registered(1)
        time.sleep(SETTLE_SECONDS)
        at_rest = rss.rss_mb(process.pid)
        AwaitsIO.start_many([{"arguments": {"seconds": 30}} for _ in range(runs)])
        awaiting = WorkflowStep.objects.filter(status="in_progress")
        wait_until(lambda: awaiting.count() >= runs, 300, f"{runs} bodies awaiting at once")
        largest = at_rest
        for _ in range(20):  # the loop has them all: sample for two seconds
            largest = max(largest, rss.rss_mb(process.pid))
            time.sleep(0.1)
    finally:
        process.kill()  # the bodies would await for half a minute more
        process.wait()
    return at_rest, largest


def trickles(runs: int, repeat: int) -> tuple[list[float], list[float]]:
    """Steps/s of the trickle with the loop off and on, paired by repetition (``bench.limits.paired``)."""
    from bench.trickle import trickle

    def loop(on: bool) -> Callable[[], float]:
        return lambda: trickle(runs, 1, 4, {} if on else {"ASYNC_CONCURRENCY": 0}).steps_per_s

    return paired(repeat, loop(False), loop(True))


class DelayServer:
    """A server on 127.0.0.1 (a loop on a thread of its own) that answers each line after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> DelayServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while line := await reader.readline():
                await asyncio.sleep(self.delay)
                writer.write(line)
                await writer.drain()
            writer.close()

        server = self._loop.run_until_complete(asyncio.start_server(answer, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()


def client_wall(class_name: str, runs: int, port: int) -> float:
    """Seconds from the first body's start to the last one's end of ``runs`` runs calling the server on ``port``."""
    from django.db.models import Max, Min

    from pgbus_workflows.dsl.declared import registry
    from pgbus_workflows.models import WorkflowRun, WorkflowStep

    cls = registry.get(class_name)
    assert cls is not None, class_name
    cls.start_many([{"arguments": {"port": port}} for _ in range(runs)])
    processes = start_dispatchers(1, 4)
    try:
        finished = WorkflowRun.objects.filter(workflow_class=class_name, status="finished")
        wait_until(lambda: finished.count() >= runs, runs + 600, f"{runs} {class_name} runs")
    finally:
        stop(processes)
    span = WorkflowStep.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return (span["last"] - span["first"]).total_seconds()


def clients(runs: int, repeat: int) -> tuple[list[float], list[float]]:
    """Wall seconds with one module-level client and with a client per step, paired by repetition."""
    with DelayServer(1.0) as server:
        return paired(
            repeat,
            lambda: client_wall("async_calls_shared", runs, server.port),
            lambda: client_wall("async_calls_per_step", runs, server.port),
        )


def main() -> None:
    """Print the tables (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--trickle-runs", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--client-runs", type=int, default=100)
    parser.add_argument("--only-clients", action="store_true", help="measure the clients alone")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.seconds, args.trickle_runs, args.repeat, args.client_runs = 200, 0.5, 100, 2, 50
    recreate_database()  # Django set up before the first measurement imports the test app
    shared, per_step = clients(args.client_runs, args.repeat)
    ratios = [b / a for a, b in zip(shared, per_step, strict=True)]
    title = f"{args.client_runs} runs, one 1 s call each, one dispatcher of four, {args.repeat} pairs"
    print(f"| {title} | wall (s), median | each repetition |")
    print("|---|---:|---|")
    for what, walls in (("one module-level client", shared), ("a client made per step", per_step)):
        print(f"| {what} | {statistics.median(walls):.2f} | {' / '.join(f'{w:.2f}' for w in walls)} |")
    print(f"| per step / module-level, paired | {statistics.median(ratios):.2f} | {described(ratios)} |")
    if args.only_clients:
        return
    print()
    serial = args.runs * args.seconds
    awaited = wall_seconds("async_awaits_io", args.runs, args.seconds)
    slept = wall_seconds("async_sleeps_io", args.runs, args.seconds)
    title = f"{args.runs:,} runs, one {args.seconds:g} s step each, one dispatcher of four"
    print(f"| {title} | wall (s) | / serial time |")
    print("|---|---:|---:|")
    print(f"| serial time (runs x seconds) | {serial:,.0f} | 1 |")
    print(f"| plain body, `time.sleep` | {slept:,.1f} | 1/{serial / slept:,.1f} |")
    print(f"| `async def` body, `await asyncio.sleep` | {awaited:,.1f} | 1/{serial / awaited:,.1f} |")
    print(f"| async wall / plain wall | {awaited / slept:.3f} | |")
    at_rest, largest = memory(args.runs)
    print()
    print(f"| dispatcher RSS | at rest (MB) | {args.runs:,} bodies awaiting (MB) | per body (KB) |")
    print("|---|---:|---:|---:|")
    per_body = (largest - at_rest) * 1024 / args.runs
    print(f"| `--async-concurrency {args.runs}` | {at_rest:.1f} | {largest:.1f} | {per_body:.1f} |")
    off, on = trickles(args.trickle_runs, args.repeat)
    ratios = [b / a for a, b in zip(off, on, strict=True)]
    print()
    header = "loop off (steps/s) | loop on (steps/s) | ratio | interval | no slower?"
    print(f"| {args.repeat} repetitions, paired | {header} |")
    print("|---|---:|---:|---:|---|---|")
    medians = f"{statistics.median(off):,.0f} | {statistics.median(on):,.0f} | {statistics.median(ratios):.2f}"
    what = f"trickle of {args.trickle_runs} plain runs, one dispatcher of four"
    print(f"| {what} | {medians} | {described(ratios)} | {no_slower(ratios)} |")


if __name__ == "__main__":
    main()
