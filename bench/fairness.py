"""Fairness between tenants (issue #52): a small tenant's runs behind a big tenant's backlog, and what it costs.

    .venv/bin/python -m bench.fairness [--big 100000] [--small 100] [--dispatchers 2] [--concurrency 4]

Each measurement has a database of its own made anew. ``Tenanted`` runs (two short steps,
``tests.testapp.fair_workflows``) are drained by ``--dispatchers`` dispatchers of
``--concurrency`` workers:

- **small alone**: ``--small`` runs of tenant B, each one ``start()``, with nothing else
  waiting: B's runs' median and 90th percentile from start to finish.
- **behind the backlog, with fairness**: tenant A starts ``--big`` runs (``start_many``)
  before the dispatchers; once they claim, B starts ``--small`` runs as above. B's median
  from start to finish (the target: within 2x of B alone), and the steps/s of all the work
  from the first claim to the last step's end.
- **the same without fairness**: the same work, ``Tenanted`` declaring no fairness (in the
  dispatchers and in this process): B's median (behind A's whole backlog) and the steps/s
  (the target: fairness's within 0.9x of it).

``--repeat N`` repeats the three, the fair and unfair measurements in alternating order (paired
by repetition), prints every figure, then the median of each ratio and their range.
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench.common import recreate_database, start_dispatchers, stop, wait_registered, wait_until

#: The environment switch of ``Tenanted``'s fairness (``tests/testapp/fair_workflows.py``).
FAIRNESS = "PGBUS_TESTAPP_FAIRNESS"


def _fair(on: bool) -> None:
    """Declare ``Tenanted``'s fairness (or not) in this process and in the dispatchers started from now on."""
    from pgbus_workflows.dsl.declared import registry
    from tests.testapp.fair_workflows import TENANT_FAIRNESS, Tenanted

    if on:
        os.environ[FAIRNESS] = "1"
    else:
        os.environ.pop(FAIRNESS, None)
    Tenanted.fairness = TENANT_FAIRNESS if on else None  # type: ignore[misc]
    registry.version += 1


def measure(big: int, small: int, dispatchers: int, concurrency: int, fair: bool) -> dict[str, float]:
    """One measurement: B's start-to-finish times (s) and the steps/s of all the work."""
    recreate_database()  # sets Django up: the imports follow
    from django.db.models import Max, Min

    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.fair_workflows import Tenanted

    _fair(fair)
    for first in range(0, big, 10_000):
        Tenanted.start_many([{"arguments": {"tenant": "a"}} for _ in range(min(10_000, big - first))])
    processes = start_dispatchers(dispatchers, concurrency)
    try:
        wait_registered(dispatchers)
        if big:
            wait_until(lambda: WorkflowStep.objects.filter(status="completed").exists(), 120, "a first step")
        for _ in range(small):
            Tenanted.start(tenant="b")
        finished = WorkflowRun.objects.filter(workflow_class=Tenanted.name, status="finished")
        wait_until(lambda: finished.filter(arguments__tenant="b").count() >= small, 1800, f"{small} runs of b")
        small_done_at = WorkflowRun.objects.filter(arguments__tenant="b").aggregate(at=Max("finished_at"))["at"]
        wait_until(lambda: finished.count() >= big + small, 1800, f"{big + small} runs")
    finally:
        stop(processes)
    b = WorkflowRun.objects.filter(arguments__tenant="b").values_list("started_at", "finished_at")
    times = sorted((end - begin).total_seconds() for begin, end in b)
    span = WorkflowStep.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    left = WorkflowRun.objects.filter(arguments__tenant="a", finished_at__gt=small_done_at).count()
    return {
        "p50": statistics.median(times),
        "p90": times[int(len(times) * 0.9) - 1],
        "steps_per_s": WorkflowStep.objects.count() / (span["last"] - span["first"]).total_seconds(),
        "a_left": float(left),
    }


def main() -> None:
    """Measure and print the three configurations."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--dispatchers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    behind, throughput = [], []
    for repetition in range(args.repeat):
        alone = measure(0, args.small, args.dispatchers, args.concurrency, fair=True)
        measured = {}
        for fair_first in (True, False) if repetition % 2 == 0 else (False, True):
            measured[fair_first] = measure(args.big, args.small, args.dispatchers, args.concurrency, fair=fair_first)
        fair, unfair = measured[True], measured[False]
        behind.append(fair["p50"] / alone["p50"])
        throughput.append(fair["steps_per_s"] / unfair["steps_per_s"])
        print(f"B alone:              p50 {alone['p50']:.3f} s, p90 {alone['p90']:.3f} s")
        print(
            f"B behind A, fair:     p50 {fair['p50']:.3f} s, p90 {fair['p90']:.3f} s "
            f"({behind[-1]:.2f}x alone); A's runs still left when B was done: {fair['a_left']:.0f}"
        )
        print(
            f"B behind A, unfair:   p50 {unfair['p50']:.3f} s, p90 {unfair['p90']:.3f} s "
            f"({unfair['p50'] / alone['p50']:.2f}x alone); A's runs still left when B was done: {unfair['a_left']:.0f}"
        )
        print(
            f"throughput: fair {fair['steps_per_s']:.0f} steps/s, unfair {unfair['steps_per_s']:.0f} steps/s "
            f"({throughput[-1]:.2f}x)",
            flush=True,
        )
    if args.repeat > 1:
        for what, ratios in (("B's p50 behind A, fair / alone", behind), ("steps/s, fair / unfair", throughput)):
            print(
                f"{what}: median {statistics.median(ratios):.2f} of {len(ratios)} pairs, "
                f"range {min(ratios):.2f} to {max(ratios):.2f}"
            )


if __name__ == "__main__":
    main()
