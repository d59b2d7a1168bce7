"""Fan-out benchmark: opening a 10,000-job fan-out, and draining it with one and two dispatchers.

    .venv/bin/python -m bench.fanout [--jobs 10000] [--concurrency 4] [--pgbench-seconds 10]

Like ``bench/dispatch.py``: everything is measured in this one run on this machine, in a
database of its own (``<DATABASE_URL name>_bench``, created and dropped here), and each rate
is also given as a ratio to pgbench's simple-update transactions/s (``pgbench -N``), the
machine's commit rate.

- insert rate: jobs/s of ``execute_step`` on the fan-out step, in this process: the body
  builds the ``Job`` objects, their arguments are encoded, the rows are bulk-inserted and the
  step parked, in one transaction.
- drain rate: jobs/s from the jobs' earliest ``started_at`` to their latest ``finished_at``,
  with dispatcher processes (``--no-sweep``) started after the fan-out was opened.

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

from bench.common import drop_database, pgbench_tps, recreate_database, start_dispatchers, stop


def open_fan_out(jobs: int) -> tuple[int, float]:
    """Start a run and execute its fan-out step here; returns (step pk, jobs/s of the opening)."""
    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from pgbus_workflows.services.claims import claim_step
    from pgbus_workflows.services.executor import execute_step
    from tests.testapp.workflows import FanBench

    WorkflowRun.objects.all().delete()
    wf = FanBench.start(count=jobs)
    claimed = claim_step(WorkflowStep.objects.get(run=wf.record).pk, "bench")
    assert claimed is not None
    began = time.perf_counter()
    execute_step(claimed)
    seconds = time.perf_counter() - began
    step = WorkflowStep.objects.get(pk=claimed.pk)
    assert (step.status, step.fan_out_total) == ("waiting", jobs), (step.status, step.fan_out_total)
    return step.pk, jobs / seconds


def drain(jobs: int, dispatchers: int, concurrency: int) -> tuple[float, float]:
    """Open a fan-out, drain it with ``dispatchers`` processes; returns (insert jobs/s, drain jobs/s)."""
    from django.db.models import Max, Min

    from pgbus_workflows.models import FanOutJob, WorkflowRun

    step_pk, insert_rate = open_fan_out(jobs)
    processes = start_dispatchers(dispatchers, concurrency)
    try:
        while not WorkflowRun.objects.filter(status="finished").exists():
            time.sleep(0.2)
    finally:
        stop(processes)
    rows = FanOutJob.objects.filter(step_id=step_pk)
    assert rows.filter(status="succeeded").count() == jobs
    span = rows.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return insert_rate, jobs / (span["last"] - span["first"]).total_seconds()


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    args = parser.parse_args()

    recreate_database()
    try:
        tps = pgbench_tps(args.concurrency, args.pgbench_seconds)
        insert_one, one = drain(args.jobs, 1, args.concurrency)
        insert_two, two = drain(args.jobs, 2, args.concurrency)
    finally:
        drop_database()
    insert = max(insert_one, insert_two)
    print(f"| measurement ({args.jobs:,}-job fan-out, concurrency {args.concurrency}) | value | vs pgbench -N |")
    print("|---|---|---|")
    print(f"| pgbench -N, {args.concurrency} clients (tps) | {tps:,.0f} | 1.00 |")
    print(f"| insert: jobs/s opening the fan-out (best of 2) | {insert:,.0f} | {insert / tps:.2f} |")
    print(f"| drain: jobs/s, 1 dispatcher | {one:,.0f} | {one / tps:.2f} |")
    print(f"| drain: jobs/s, 2 dispatchers | {two:,.0f} | {two / tps:.2f} |")


if __name__ == "__main__":
    main()
