"""Flow control's cost and accuracy (issue #37): what limits cost the runs that have none, and what they hold.

    .venv/bin/python -m bench.limits [--runs 1000] [--repeat 7] [--rate-runs 500] [--quick]

Measured in this one run on this machine, in a database of its own made anew for each
measurement, every figure a ratio paired by repetition (the configurations alternate their
order from one repetition to the next), with the median's sign-test interval:

- **runs without limits, trickle**: ``bench.trickle``'s trickle (a client process starts
  ``NoOp3`` runs one transaction each while one dispatcher of four drains them), in a project
  that declares no limit (the baseline: the test project with ``PGBUS_TESTAPP_WITHOUT_LIMITS=1``,
  whose claims are the plain statement) and in one that declares some (the claims carry the
  limits' clauses). The runs are the same, without limits.
- **runs without limits, backlog**: ``--runs`` ``NoOp3`` runs started before one dispatcher
  of four drains them (steps/s from the first claim to the last step's end), the same two projects.
- **a backlog of distinct keys, limit 1**: ``--runs`` ``KeyedNoOp`` runs, each its own
  ``Concurrency`` key with limit 1, against the same backlog of ``NoOp3`` runs (both in the
  project with limits). Each key holds one run: the limit never holds a step back, so the
  ratio is what a limit costs a step (a limiter row locked and written by the claim, the
  slot given back by the outcome, no chained claim).
- **a rate limit's observed rate**: ``--rate-runs`` ``RateNoOp`` runs under one bucket of 50
  per second, drained by two dispatchers of four: after the burst of 50, the claims' rate
  (from their ``started_at``) against the budget.

- **a backlog behind a full key**: ``--runs`` ``NoOp3`` runs drained by one dispatcher of four
  while ``--held`` ``KeyedSleeper`` steps wait behind one key whose one slot a step holds
  (its body sleeps for the whole measurement), against the same with the slot held and
  nothing waiting behind it (issue #48: a claim of any class walked every held-back step).
  The dispatcher starts first and its claims park the held-back steps (how long that takes
  is printed too); the tables are vacuumed in both (the parks' dead index entries gone, as
  autovacuum does within a minute), the runs are started then, and steps/s counted from
  their first claim.

- **a backlog behind a held class**: ``--runs`` ``NoOp3`` runs drained by one dispatcher of
  four while ``--held`` ``HeldWork`` steps are due and their class is held (``hold_class``,
  issue #52), against the same with nothing held and nothing behind them: what a hold's
  backlog costs the other classes' claims (the hold parks its steps out of the claims' range).
  The backlog is started first and the class held then, as an operator holds a class whose
  steps pile up; how long ``hold_class`` took to park them is printed too.
  ``--held-class-only`` measures this table alone.

With ``--against PATH`` (a checkout of an earlier commit, e.g. ``git archive <commit> | tar
-x -C PATH``), the last table is instead ``--runs`` ``NoOp3`` runs started before one
dispatcher of four drains them, in a project that declares no limit, the dispatcher running
PATH's code (the baseline) or this tree's: what a change to the claim costs the runs
without limits.

``--quick`` shrinks every size (a smoke run, not figures to publish); ``--held-back-only``
measures the last table alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from bench.common import (
    DISPATCHER_CHECKOUT,
    SETTLE_SECONDS,
    recreate_database,
    start_dispatchers,
    stop,
    wait_registered,
    wait_until,
)
from bench.intervals import described, no_slower

#: The environment switch of a project that declares no limit (``tests/testapp/limited_workflows.py``).
WITHOUT_LIMITS = "PGBUS_TESTAPP_WITHOUT_LIMITS"


def without_limits(on: bool) -> None:
    """Make the dispatchers and clients started from now on a project that declares no limit (or one that does)."""
    if on:
        os.environ[WITHOUT_LIMITS] = "1"
    else:
        os.environ.pop(WITHOUT_LIMITS, None)


def backlog(class_name: str, runs: int, dispatchers: int = 1, concurrency: int = 4) -> float:
    """Steps/s draining ``runs`` runs of ``class_name`` started before the dispatchers (first claim to last end)."""
    from django.db.models import Max, Min

    from pgbus_workflows.dsl.declared import registry
    from pgbus_workflows.models import WorkflowRun, WorkflowStep

    cls = registry.get(class_name)
    assert cls is not None, class_name
    cls.start_many([{"arguments": {"key": str(n)}} for n in range(runs)])
    processes = start_dispatchers(dispatchers, concurrency)
    try:
        finished = WorkflowRun.objects.filter(workflow_class=class_name, status="finished")
        wait_until(lambda: finished.count() >= runs, 600, f"{runs} {class_name} runs")
    finally:
        stop(processes)
    steps = WorkflowStep.objects.filter(run__workflow_class=class_name)
    span = steps.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return steps.count() / (span["last"] - span["first"]).total_seconds()


def behind_a_full_key(held: int, runs: int) -> float:
    """NoOp3 steps/s draining ``runs`` runs while ``held`` steps wait behind one full key (its slot held throughout)."""
    from django.db import connection
    from django.db.models import Max, Min

    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.limited_workflows import KeyedSleeper
    from tests.testapp.workflows import NoOp3

    KeyedSleeper.start(account="hot", seconds=3600)  # takes the key's one slot, and keeps it
    for first in range(0, held, 10_000):
        KeyedSleeper.start_many([{"arguments": {"account": "hot"}} for _ in range(min(10_000, held - first))])
    processes = start_dispatchers(1, 4)
    try:
        wait_registered(1)
        began = time.monotonic()
        parked = WorkflowStep.objects.filter(status="scheduled", parked=True)
        wait_until(lambda: parked.count() >= held, 900, f"{held} held-back steps parked")
        if held:
            PARK_SECONDS.append(time.monotonic() - began)
        with connection.cursor() as cursor:  # as autovacuum does within a minute of the parks' updates
            cursor.execute(f"VACUUM ANALYZE {WorkflowStep._meta.db_table}, {WorkflowRun._meta.db_table}")
        time.sleep(SETTLE_SECONDS)
        NoOp3.start_many([{} for _ in range(runs)])
        finished = WorkflowRun.objects.filter(workflow_class=NoOp3.name, status="finished")
        wait_until(lambda: finished.count() >= runs, 900, f"{runs} NoOp3 runs behind {held} held-back steps")
    finally:
        stop(processes)
    if held:
        COUNT_SECONDS.append(seconds_to_count())
    steps = WorkflowStep.objects.filter(run__workflow_class=NoOp3.name)
    span = steps.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return steps.count() / (span["last"] - span["first"]).total_seconds()


def behind_a_held_class(held: int, runs: int) -> float:
    """NoOp3 steps/s draining ``runs`` runs while ``held`` due steps of a held class wait (none: nothing held)."""
    from django.db import connection
    from django.db.models import Max, Min

    from pgbus_workflows import hold_class
    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.held_workflows import HeldWork
    from tests.testapp.workflows import NoOp3

    for first in range(0, held, 10_000):
        HeldWork.start_many([{} for _ in range(min(10_000, held - first))])
    if held:  # the backlog was there when the operator held its class: the hold parks it at once
        began = time.perf_counter()
        hold_class(HeldWork, actor="bench", reason="a held class's backlog")
        HOLD_SECONDS.append(time.perf_counter() - began)
        assert WorkflowStep.objects.filter(status="scheduled", parked=True).count() == held
    processes = start_dispatchers(1, 4)
    try:
        wait_registered(1)
        with connection.cursor() as cursor:  # as autovacuum does within a minute of the parks' updates
            cursor.execute(f"VACUUM ANALYZE {WorkflowStep._meta.db_table}, {WorkflowRun._meta.db_table}")
        time.sleep(SETTLE_SECONDS)
        NoOp3.start_many([{} for _ in range(runs)])
        finished = WorkflowRun.objects.filter(workflow_class=NoOp3.name, status="finished")
        wait_until(lambda: finished.count() >= runs, 900, f"{runs} NoOp3 runs behind {held} held steps")
    finally:
        stop(processes)
    steps = WorkflowStep.objects.filter(run__workflow_class=NoOp3.name)
    span = steps.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return steps.count() / (span["last"] - span["first"]).total_seconds()


#: How long the held-back counts took behind the held-back steps, one figure a measurement.
COUNT_SECONDS: list[float] = []
#: How long the dispatcher took to park the held-back steps once registered (a claim after its start).
PARK_SECONDS: list[float] = []
#: How long ``hold_class`` took, parking the held class's backlog, one figure a measurement.
HOLD_SECONDS: list[float] = []


def seconds_to_count() -> float:
    """The best of three readings of the held-back counts (the dashboard's and the metric's)."""
    from pgbus_workflows.services.limiting import held_back_counts
    from pgbus_workflows.sql import clock

    times = []
    for _ in range(3):
        began = time.perf_counter()
        held_back_counts(clock.now())
        times.append(time.perf_counter() - began)
    return min(times)


def paired(repeat: int, baseline: Callable[[], float], other: Callable[[], float]) -> tuple[list[float], list[float]]:
    """``repeat`` measurements of each, paired, in an order alternating by repetition; a database made anew for each."""
    first: list[float] = []
    second: list[float] = []
    for repetition in range(repeat):
        for is_other in (False, True) if repetition % 2 == 0 else (True, False):
            recreate_database()
            (second if is_other else first).append((other if is_other else baseline)())
    return first, second


def with_project(limits: bool, measure: Callable[[], float]) -> Callable[[], float]:
    """``measure`` in a project that declares limits or none (its dispatchers' and client's environment)."""

    def run() -> float:
        without_limits(not limits)
        try:
            return measure()
        finally:
            without_limits(False)

    return run


def observed_rate(runs: int, dispatchers: int = 2, concurrency: int = 4) -> tuple[float, float]:
    """``(claims/s after the burst, the budget)`` for ``runs`` ``RateNoOp`` runs drained by ``dispatchers``."""
    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.limited_workflows import RateNoOp

    recreate_database()
    processes = start_dispatchers(dispatchers, concurrency)
    try:
        wait_registered(dispatchers)
        time.sleep(SETTLE_SECONDS)
        RateNoOp.start_many([{} for _ in range(runs)])
        finished = WorkflowRun.objects.filter(workflow_class=RateNoOp.name, status="finished")
        wait_until(lambda: finished.count() >= runs, 600, f"{runs} rate-limited runs")
    finally:
        stop(processes)
    limit = RateNoOp.call.rate_limit
    starts = sorted(s.timestamp() for s in WorkflowStep.objects.values_list("started_at", flat=True))
    # The burst (the full bucket) goes at once; from the last of it, one token every per/limit.
    after_burst = starts[limit.limit - 1 :]
    rate = (len(after_burst) - 1) / (after_burst[-1] - after_burst[0])
    return rate, limit.limit / limit.per.total_seconds()


def row(what: str, baseline: list[float], other: list[float], floor: float | None = None) -> str:
    """A Markdown row: both medians, the paired ratios' median, its interval, and the verdict."""
    ratios = [b / a for a, b in zip(baseline, other, strict=True)]
    median = statistics.median(ratios)
    verdict = no_slower(ratios) if floor is None else ("**yes**" if median >= floor else "**no**")
    return (
        f"| {what} | {statistics.median(baseline):,.0f} | {statistics.median(other):,.0f} | {median:.2f} "
        f"| {described(ratios)} | {verdict} |"
    )


def main() -> None:
    """Print the tables (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--trickle-runs", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--rate-runs", type=int, default=500)
    parser.add_argument("--held", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--held-back-only", action="store_true")
    parser.add_argument("--held-class-only", action="store_true")
    parser.add_argument("--against", help="a checkout whose dispatchers are the baseline (runs without limits)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.trickle_runs, args.repeat, args.rate_runs, args.held = 200, 100, 2, 120, 5000
    if args.against:
        against_checkout(args)
        return
    if args.held_class_only:
        recreate_database()
        pair = paired(
            args.repeat, lambda: behind_a_held_class(0, args.runs), lambda: behind_a_held_class(args.held, args.runs)
        )
        print("| backlog behind a held class | nothing held | held | ratio | interval | >= 0.9? |")
        print("|---|---:|---:|---:|---|---|")
        print(row(f"{args.runs:,} NoOp3 runs, {args.held:,} steps of a held class due", *pair, floor=0.9))
        print(f"\nhold_class, parking them: {statistics.median(HOLD_SECONDS):.1f} s (median).")
        return
    if not args.held_back_only:
        other_tables(args)
    recreate_database()
    behind = paired(
        args.repeat, lambda: behind_a_full_key(0, args.runs), lambda: behind_a_full_key(args.held, args.runs)
    )
    print()
    print("| backlog behind a full key | nothing held back | held back | ratio | interval | >= 0.9? |")
    print("|---|---:|---:|---:|---|---|")
    print(row(f"{args.runs:,} NoOp3 runs, {args.held:,} steps held back", *behind, floor=0.9))
    print(f"\nThe held-back counts behind them: {statistics.median(COUNT_SECONDS) * 1000:.1f} ms (median);")
    print(f"parking them once the dispatcher registered: {statistics.median(PARK_SECONDS):.1f} s (median).")


def against_checkout(args: argparse.Namespace) -> None:
    """Runs without limits drained by dispatchers of another checkout's code, then of this tree's, paired."""

    def drained(checkout: str | None) -> Callable[[], float]:
        def run() -> float:
            if checkout:
                os.environ[DISPATCHER_CHECKOUT] = checkout
            try:
                return backlog("noop3", args.runs)
            finally:
                os.environ.pop(DISPATCHER_CHECKOUT, None)

        return with_project(False, run)

    recreate_database()
    pair = paired(args.repeat, drained(args.against), drained(None))
    print(f"| {args.repeat} repetitions, paired | {args.against} | this tree | ratio | interval | no slower? |")
    print("|---|---:|---:|---:|---|---|")
    print(row(f"runs without limits, backlog of {args.runs:,} NoOp3 runs (steps/s)", *pair))


def other_tables(args: argparse.Namespace) -> None:
    """The tables of limits' cost to the runs without limits, of a backlog of distinct keys, and of the rate."""
    from bench.trickle import trickle

    def trickled() -> float:
        return trickle(args.trickle_runs, 1, 4).steps_per_s

    def noop_backlog() -> float:
        return backlog("noop3", args.runs)

    def keyed_backlog() -> float:
        return backlog("keyed_noop", args.runs)

    recreate_database()  # Django set up before the first measurement imports the test app
    rows = [
        (what, *paired(args.repeat, with_project(False, measure), measure))
        for what, measure in (("trickle", trickled), ("backlog", noop_backlog))
    ]
    keyed = paired(args.repeat, noop_backlog, keyed_backlog)
    print(f"| {args.repeat} repetitions, paired | baseline | with limits | ratio | interval | no slower? |")
    print("|---|---:|---:|---:|---|---|")
    for what, baseline, other in rows:
        print(row(f"runs without limits, {what} (steps/s): no limit declared vs limits declared", baseline, other))
    print()
    print("| backlog of distinct keys, limit 1 | NoOp3 steps/s | KeyedNoOp steps/s | ratio | interval | >= 0.8? |")
    print("|---|---:|---:|---:|---|---|")
    print(row(f"{args.runs:,} runs, one dispatcher of four", keyed[0], keyed[1], floor=0.8))
    rate, budget = observed_rate(args.rate_runs)
    print()
    print("| rate limit | budget (/s) | observed (/s) | observed / budget | within 5 %? |")
    print("|---|---:|---:|---:|---|")
    within = "**yes**" if abs(rate / budget - 1) <= 0.05 else "**no**"
    ratio = rate / budget
    print(f"| {args.rate_runs} runs, two dispatchers of four | {budget:.0f} | {rate:.1f} | {ratio:.3f} | {within} |")


if __name__ == "__main__":
    main()
