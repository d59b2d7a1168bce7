"""Dispatcher benchmark: steps/s with one and two dispatchers, against pgbench, and idle latency.

    .venv/bin/python bench/dispatch.py [--runs 1000] [--latency-samples 200]

Everything is measured in this one run on this machine, in a database of its own
(``<DATABASE_URL name>_bench``, created and dropped here): the figure that matters is the
ratio of steps/s to pgbench's simple-update transactions/s (``pgbench -N``), the machine's
commit rate. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BASE_URL = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/pgbus_workflows")
BENCH_URL = BASE_URL.rsplit("/", 1)[0] + "/" + BASE_URL.rsplit("/", 1)[1].split("?")[0] + "_bench"
os.environ["DATABASE_URL"] = BENCH_URL
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402 - the environment must be set first
import environ  # noqa: E402


def psql_args(url: str) -> tuple[list[str], str]:
    """pgbench/psql connection flags and the database name of ``url``."""
    config = environ.Env.db_url_config(url)
    flags = ["-h", config.get("HOST") or "127.0.0.1", "-p", str(config.get("PORT") or 5432)]
    if config.get("USER"):
        flags += ["-U", config["USER"]]
    return flags, config["NAME"]


def recreate_database() -> None:
    """Drop and create the bench database, then migrate it."""
    import psycopg

    _, name = psql_args(BENCH_URL)
    config = environ.Env.db_url_config(BENCH_URL)
    with psycopg.connect(
        dbname="postgres",
        host=config.get("HOST") or "127.0.0.1",
        port=config.get("PORT") or 5432,
        user=config.get("USER") or None,
        autocommit=True,
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def pgbench_tps(clients: int, seconds: int) -> float:
    """``pgbench -N`` (simple update) transactions per second on the bench database."""
    flags, name = psql_args(BENCH_URL)
    subprocess.run(["pgbench", "-i", "-q", "-s", "1", *flags, name], check=True, capture_output=True)
    out = subprocess.run(
        ["pgbench", "-N", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds), *flags, name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r"tps = ([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"no tps in pgbench output:\n{out}")
    return float(match.group(1))


def start_dispatchers(count: int, concurrency: int) -> list[subprocess.Popen[bytes]]:
    """Dispatcher processes on the bench database, without the sweep."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "django",
                "run_workflow_dispatcher",
                "--no-sweep",
                "-v",
                "0",
                "--concurrency",
                str(concurrency),
            ],
            cwd=ROOT,
            env=env,
        )
        for _ in range(count)
    ]


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM and wait."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=60)


def wait_registered(count: int) -> None:
    """Until ``count`` dispatchers have their row (they are ready to claim)."""
    from pgbus_workflows.models import Dispatcher

    while Dispatcher.objects.count() < count:
        time.sleep(0.05)


def throughput(runs: int, dispatchers: int, concurrency: int) -> float:
    """Steps/s for ``runs`` three-step runs started before the dispatchers."""
    from django.db.models import Max, Min

    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.workflows import NoOp3

    WorkflowRun.objects.all().delete()
    for _ in range(runs):
        NoOp3.start()
    processes = start_dispatchers(dispatchers, concurrency)
    try:
        while WorkflowRun.objects.filter(status="finished").count() < runs:
            time.sleep(0.2)
    finally:
        stop(processes)
    span = WorkflowStep.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    seconds = (span["last"] - span["first"]).total_seconds()
    return 3 * runs / seconds


def latency(samples: int) -> tuple[float, float]:
    """p50 and p99 milliseconds from a committed start() to its step starting, one idle dispatcher."""
    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.workflows import NoOp1

    WorkflowRun.objects.all().delete()
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
    one = throughput(args.runs, 1, args.concurrency)
    two = throughput(args.runs, 2, args.concurrency)
    p50, p99 = latency(args.latency_samples)
    print(f"| measurement ({args.runs} three-step runs, concurrency {args.concurrency}) | value | vs pgbench -N |")
    print("|---|---|---|")
    print(f"| pgbench -N, {args.concurrency} clients (tps) | {tps:,.0f} | 1.00 |")
    print(f"| steps/s, 1 dispatcher | {one:,.0f} | {one / tps:.2f} |")
    print(f"| steps/s, 2 dispatchers | {two:,.0f} | {two / tps:.2f} |")
    print(f"| idle start-to-first-step latency p50 / p99 (ms) | {p50:.1f} / {p99:.1f} | |")


if __name__ == "__main__":
    main()
