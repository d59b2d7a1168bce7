"""Dispatcher benchmark: steps/s with one and two dispatchers, against pgbench, and idle latency.

    .venv/bin/python -m bench.dispatch [--runs 1000] [--latency-samples 200]

Everything is measured in this one run on this machine, in a database of its own
(``<DATABASE_URL name>_bench``, created and dropped here): the figure that matters is the
ratio of steps/s to pgbench's simple-update transactions/s (``pgbench -N``), the machine's
commit rate; steps/s are the median of three measurements. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import pgbench_tps, recreate_database, start_dispatchers, stop, wait_registered


def throughput(runs: int, dispatchers: int, concurrency: int, settings: dict[str, Any] | None = None) -> float:
    """Steps/s for ``runs`` three-step runs started before the dispatchers (``settings``: theirs).

    Runs of earlier measurements are deleted first; history written by ``bench.history``
    (class ``history``) stays.
    """
    from django.db.models import Max, Min

    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.workflows import NoOp3

    WorkflowRun.objects.filter(workflow_class=NoOp3.name).delete()
    for _ in range(runs):
        NoOp3.start()
    processes = start_dispatchers(dispatchers, concurrency, settings)
    try:
        while WorkflowRun.objects.filter(workflow_class=NoOp3.name, status="finished").count() < runs:
            time.sleep(0.2)
    finally:
        stop(processes)
    measured = WorkflowStep.objects.filter(run__workflow_class=NoOp3.name)
    span = measured.aggregate(first=Min("started_at"), last=Max("finished_at"))
    seconds = (span["last"] - span["first"]).total_seconds()
    return 3 * runs / seconds


def median_throughput(
    runs: int, dispatchers: int, concurrency: int, settings: dict[str, Any] | None = None, repeat: int = 3
) -> float:
    """The median of ``repeat`` throughput measurements: one lasts about a second, so noise shows."""
    return statistics.median(throughput(runs, dispatchers, concurrency, settings) for _ in range(repeat))


def latency(samples: int) -> tuple[float, float]:
    """p50 and p99 milliseconds from a committed start() to its step starting, one idle dispatcher."""
    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.workflows import NoOp1

    WorkflowRun.objects.filter(workflow_class=NoOp1.name).delete()
    processes = start_dispatchers(1, 1)
    wait_registered(1)
    results = []
    try:
        for _ in range(samples):
            wf = NoOp1.start()
            while not WorkflowRun.objects.filter(pk=wf.record.pk, status="finished").exists():
                time.sleep(0.001)
            step = WorkflowStep.objects.get(run=wf.record)
            results.append((step.started_at - wf.record.created_at).total_seconds() * 1000)
            time.sleep(0.01)
    finally:
        stop(processes)
    quantiles = statistics.quantiles(results, n=100)
    return quantiles[49], quantiles[98]


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    args = parser.parse_args()

    recreate_database()
    tps = pgbench_tps(args.concurrency, args.pgbench_seconds)
    one = median_throughput(args.runs, 1, args.concurrency)
    two = median_throughput(args.runs, 2, args.concurrency)
    unbatched = median_throughput(args.runs, 1, args.concurrency, {"BATCH_SIZE": 1})
    p50, p99 = latency(args.latency_samples)
    print(f"| measurement ({args.runs} three-step runs, concurrency {args.concurrency}) | value | vs pgbench -N |")
    print("|---|---|---|")
    print(f"| pgbench -N, {args.concurrency} clients (tps) | {tps:,.0f} | 1.00 |")
    print(f"| steps/s, 1 dispatcher | {one:,.0f} | {one / tps:.2f} |")
    print(f"| steps/s, 2 dispatchers | {two:,.0f} | {two / tps:.2f} |")
    print(f"| steps/s, 1 dispatcher, BATCH_SIZE 1 (a commit per step) | {unbatched:,.0f} | {unbatched / tps:.2f} |")
    print(f"| idle start-to-first-step latency p50 / p99 (ms) | {p50:.1f} / {p99:.1f} | |")


if __name__ == "__main__":
    main()
