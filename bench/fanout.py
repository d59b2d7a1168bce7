"""Fan-out benchmark: opening a 10,000-job fan-out, and draining it with one and two dispatchers.

    .venv/bin/python bench/fanout.py [--jobs 10000] [--concurrency 4] [--pgbench-seconds 10]

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
import os
import re
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


def admin_connection():  # type: ignore[no-untyped-def]
    """An autocommit connection to the server's ``postgres`` database."""
    import psycopg

    config = environ.Env.db_url_config(BENCH_URL)
    return psycopg.connect(
        dbname="postgres",
        host=config.get("HOST") or "127.0.0.1",
        port=config.get("PORT") or 5432,
        user=config.get("USER") or None,
        password=config.get("PASSWORD") or None,
        autocommit=True,
    )


def recreate_database() -> None:
    """Drop and create the bench database, then migrate it."""
    _, name = psql_args(BENCH_URL)
    with admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def drop_database() -> None:
    """Drop the bench database (after closing Django's connection to it)."""
    from django.db import connections

    connections.close_all()
    _, name = psql_args(BENCH_URL)
    with admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
    command = [sys.executable, "-m", "django", "run_workflow_dispatcher", "--no-sweep", "-v", "0"]
    return [subprocess.Popen([*command, "--concurrency", str(concurrency)], cwd=ROOT, env=env) for _ in range(count)]


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM and wait."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=60)


def open_fan_out(jobs: int) -> tuple[int, float]:
    """Start a run and execute its fan-out step here; returns (step pk, jobs/s of the opening)."""
    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from pgbus_workflows.services.executor import claim_step, execute_step
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
