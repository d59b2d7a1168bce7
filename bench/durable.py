"""Durable functions (issue #51): what a checkpoint costs beside a step, and a long function's replays.

    .venv/bin/python -m bench.durable [--runs 1000] [--repeat 6] [--checkpoints 250,500,1000] [--quick]

Measured in this one run on this machine, in a database of its own made anew for each
measurement (``bench.common``: ``<DATABASE_URL name>_bench``):

- **three checkpoints against three steps**: ``--runs`` runs of ``durable_noop3`` (a durable
  function of three empty checkpoints) against as many of ``NoOp3`` (three empty steps), in
  two shapes. *Backlog*: the runs are started (``start_many``) before one dispatcher of four
  drains them; steps/s = 3 x runs / (the last attempt's ``finished_at`` - the first one's
  ``started_at``). *Trickle*: ``bench.trickle``'s client starts them one transaction each, as
  web requests would, while one dispatcher of four drains them; steps/s = 3 x runs / (the last
  attempt's ``finished_at`` - the client's clock before its first call). A checkpoint counts as
  a step. Paired by repetition in an order alternating from one repetition to the next
  (``bench.limits.paired``); the median of the ratios durable / steps and its sign-test
  interval (``bench.intervals``). The goal: >= 0.9x.
- **a long function**: one run of ``durable_long``, ``N`` empty checkpoints that park (a
  ``ctx.sleep`` of 0) after every 100, so the function runs N / 100 + 1 times, each replaying
  what is recorded; one dispatcher of four; seconds from its first attempt's start to its last
  one's end, for each ``--checkpoints`` size, the median of ``--repeat``; and ms per
  checkpoint. Linear in N: the ms per checkpoint stays flat (a replay reads the recorded
  outputs in one query and returns them without a call, so its cost per checkpoint is small
  beside a new checkpoint's commit).

``--quick`` shrinks every size (a smoke run, not figures to publish).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from bench.common import (
    SETTLE_SECONDS,
    checkpoint,
    recreate_database,
    run_json,
    start_dispatchers,
    stop,
    wait_registered,
    wait_until,
)
from bench.intervals import described, no_slower
from bench.limits import paired

#: The classes compared: three empty steps, three empty checkpoints.
STEPS, FUNCTION = "noop3", "durable_noop3"
#: Checkpoints (steps) per run of either class.
PER_RUN = 3
#: ``durable_long`` parks after every this many checkpoints.
PARK_EVERY = 100


def _span(class_name: str) -> tuple[float, float]:
    """Epoch seconds of the class's first attempt's start and last attempt's end."""
    from django.db.models import Max, Min

    from pgbus_workflows.models import WorkflowStep

    span = WorkflowStep.objects.filter(run__workflow_class=class_name).aggregate(
        first=Min("started_at"), last=Max("finished_at")
    )
    return span["first"].timestamp(), span["last"].timestamp()


def _drain(class_name: str, runs: int, start: Callable[[], float | None]) -> float:
    """Steps/s: start the runs with ``start()`` (its return: the first call's epoch seconds, or None)."""
    from pgbus_workflows.models import WorkflowRun

    checkpoint()
    processes = start_dispatchers(1, 4)
    try:
        wait_registered(1)
        time.sleep(SETTLE_SECONDS)
        began = start()
        finished = WorkflowRun.objects.filter(workflow_class=class_name, status="finished")
        wait_until(lambda: finished.count() >= runs, 600 + runs, f"{runs} {class_name} runs")
    finally:
        stop(processes)
    first, last = _span(class_name)
    return PER_RUN * runs / (last - (began if began is not None else first))


def backlog(class_name: str, runs: int) -> Callable[[], float]:
    """A measurement: ``runs`` runs started before the dispatcher, then drained."""
    from pgbus_workflows.dsl.declared import registry

    def measure() -> float:
        cls = registry.get(class_name)
        assert cls is not None, class_name
        cls.start_many([{"arguments": {}} for _ in range(runs)])
        return _drain(class_name, runs, lambda: None)

    return measure


def trickle(class_name: str, runs: int) -> Callable[[], float]:
    """A measurement: ``runs`` runs started one transaction each by ``bench.trickle_client`` while drained."""
    import sys

    def started() -> float:
        report = run_json([sys.executable, "-m", "bench.trickle_client", "trickle", "--runs", str(runs),
                           "--workflow", class_name])  # fmt: skip
        return float(report["first_call"])

    return lambda: _drain(class_name, runs, started)


def long_function(checkpoints: int) -> float:
    """Seconds one ``durable_long`` run of ``checkpoints`` takes, from its first attempt to its last."""
    from pgbus_workflows.models import WorkflowRun
    from tests.testapp.durable_workflows import durable_long

    recreate_database()
    checkpoint()
    processes = start_dispatchers(1, 4)
    try:
        wait_registered(1)
        time.sleep(SETTLE_SECONDS)
        run = durable_long.start(None, checkpoints=checkpoints, park_every=PARK_EVERY)
        done = WorkflowRun.objects.filter(pk=run.record.pk, status="finished")
        wait_until(done.exists, 600 + checkpoints, f"a function of {checkpoints} checkpoints")
    finally:
        stop(processes)
    first, last = _span("durable_long")
    return last - first


def print_pairs(runs: int, repeat: int) -> None:
    """The backlog and trickle table: steps/s of each, the paired ratio, its interval, the goal."""
    print(f"| {runs:,} runs, one dispatcher of four, {repeat} pairs | steps (steps/s) | function (checkpoints/s) "
          "| ratio | interval | >= 0.9x? |")  # fmt: skip
    print("|---|---:|---:|---:|---|---|")
    for shape, measure in (("backlog", backlog), ("trickle", trickle)):
        steps, function = paired(repeat, measure(STEPS, runs), measure(FUNCTION, runs))
        ratios = [f / s for s, f in zip(steps, function, strict=True)]
        ratio = statistics.median(ratios)
        goal = "yes" if ratio >= 0.9 else f"**no** (no slower than steps: {no_slower(ratios)})"
        print(f"| {shape} | {statistics.median(steps):,.0f} | {statistics.median(function):,.0f} | {ratio:.2f} "
              f"| {described(ratios)} | {goal} |")  # fmt: skip


def print_long(sizes: list[int], repeat: int) -> None:
    """The long function's table: seconds per size, ms per checkpoint, and that against the smallest size's."""
    print(f"| one function, parks every {PARK_EVERY}, median of {repeat} | seconds | ms per checkpoint "
          f"| per checkpoint / at {sizes[0]:,} |")  # fmt: skip
    print("|---|---:|---:|---:|")
    base = None
    for size in sizes:
        seconds = statistics.median(long_function(size) for _ in range(repeat))
        per = seconds * 1000 / size
        base = base or per
        print(f"| {size:,} checkpoints ({size // PARK_EVERY} parks) | {seconds:.2f} | {per:.2f} | {per / base:.2f} |")


def main() -> None:
    """Print the tables (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--checkpoints", default="250,500,1000", help="the long function's sizes, comma-separated")
    parser.add_argument("--long-repeat", type=int, default=3)
    parser.add_argument("--only", choices=("pairs", "long"), help="measure one table alone")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = [int(size) for size in args.checkpoints.split(",")]
    if args.quick:
        args.runs, args.repeat, args.long_repeat, sizes = 100, 2, 1, [200, 400]
    recreate_database()  # Django set up before the first measurement imports the test app
    if args.only != "long":
        print_pairs(args.runs, args.repeat)
        print()
    if args.only != "pairs":
        print_long(sizes, args.long_repeat)


if __name__ == "__main__":
    main()
