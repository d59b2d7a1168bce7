"""Child workflows benchmark: 1,000 parents with 10 children each, drained by a dispatcher.

    .venv/bin/python -m bench.children [--parents 1000] [--children 10] [--concurrency 4]

Measured in this one run, in a database of its own (``<DATABASE_URL name>_bench``):

- baseline: runs/s of as many one-step runs as there are children (``SlowChild``, started
  with ``start_many``), from the first ``started_at`` of their steps to the last ``finished_at``;
- children: children/s, the same span over the children of ``Many`` parents (each parent's
  fan-out starts its children in the transaction that parks it); reported with its ratio
  to the baseline (a child costs a one-step run plus its share of the parents' work);
- resolution latency: per parent, from its last child's end (the child run's ``finished_at``)
  to the end of the parent's fan-out attempt (its ``finished_at``: the after-commit wake-up,
  the run lock, the resolution), p50 / p90 / p99 in ms.

Prints a Markdown table.
"""

from __future__ import annotations

import argparse

from bench.common import (
    drop_database,
    quantiles_ms,
    recreate_database,
    start_dispatchers,
    stop,
    wait_registered,
    wait_until,
)


def _span(step_rows) -> float:
    from django.db.models import Max, Min

    span = step_rows.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return (span["last"] - span["first"]).total_seconds()


def baseline(count: int, concurrency: int) -> float:
    """Runs/s of ``count`` one-step runs drained by one dispatcher."""
    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.child_workflows import SlowChild

    WorkflowRun.objects.all().delete()
    SlowChild.start_many([{"arguments": {"n": i}} for i in range(count)])
    processes = start_dispatchers(1, concurrency)
    try:
        wait_until(lambda: not WorkflowRun.objects.ongoing().exists(), 1800, "the baseline runs")
    finally:
        stop(processes)
    return count / _span(WorkflowStep.objects.all())


def children(parents: int, each: int, concurrency: int) -> tuple[float, list[float]]:
    """Children/s and the parents' resolution latencies (ms) of ``parents`` x ``each`` children."""
    from django.db.models import Max

    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.child_workflows import Many

    WorkflowRun.objects.all().delete()
    processes = start_dispatchers(1, concurrency)
    try:
        wait_registered(1)
        Many.start_many([{"arguments": {"count": each}} for _ in range(parents)])
        wait_until(lambda: not WorkflowRun.objects.ongoing().exists(), 1800, "the parents and their children")
    finally:
        stop(processes)
    finished = WorkflowRun.objects.filter(workflow_class="slow_child", status="finished").count()
    assert finished == parents * each, finished
    rate = finished / _span(WorkflowStep.objects.filter(run__workflow_class="slow_child"))
    last_child = dict(
        WorkflowRun.objects.filter(workflow_class="slow_child")
        .values("parent_id")
        .annotate(last=Max("finished_at"))
        .values_list("parent_id", "last")
    )
    resolved = WorkflowStep.objects.filter(run__workflow_class="many_children", step_name="spawn", outcome="success")
    latencies = [
        (end - last_child[run_pk]).total_seconds() for run_pk, end in resolved.values_list("run_id", "finished_at")
    ]
    return rate, quantiles_ms(latencies, 50, 90, 99)


def main() -> None:
    """Run both measurements and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--children", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    recreate_database()
    try:
        base = baseline(args.parents * args.children, args.concurrency)
        rate, (p50, p90, p99) = children(args.parents, args.children, args.concurrency)
    finally:
        drop_database()
    print(f"| measurement ({args.parents:,} parents x {args.children} children, 1 dispatcher) | value | ratio |")
    print("|---|---|---|")
    print(f"| baseline: one-step runs/s | {base:,.0f} | 1.00 |")
    print(f"| children/s | {rate:,.0f} | {rate / base:.2f} |")
    print(
        f"| parent's resolution after its last child ends, p50 / p90 / p99 ms | {p50:.1f} / {p90:.1f} / {p99:.1f} | |"
    )


if __name__ == "__main__":
    main()
