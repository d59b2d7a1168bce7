"""Django's tasks (issue #39): this backend against django-tasks-db on the same workload.

    .venv/bin/python -m bench.tasks [--tasks 1000] [--samples 100] [--repeat 5] [--quick]

Both run the same project (``bench.taskbench``: the same ``@task`` functions, the same client
``bench.taskbench.client``), each on a database of its own made anew for each measurement.
Ours runs in this project's virtualenv with one ``run_workflow_dispatcher`` (its default
four threads); django-tasks-db 0.13 (with the django-tasks backport, on Django 5.2) in a
virtualenv of its own, ``bench/.peers/tasksdb-venv`` (made by this script the first time),
with ``db_worker``, one process and four, at its defaults (it polls every second).

- **trickle**: the worker starts and settles; then the client calls ``empty.enqueue()``
  ``--tasks`` times back to back, each call its own transaction, as web requests would.
  Tasks/s = tasks / (the last task's ``finished_at`` - the client's clock before its first call).
  The two backends alternate their order from one repetition to the next; the ratio of each
  repetition is paired, with the median's sign-test interval.
- **idle latency**: one idle worker; the client notes ``time.time()``, calls ``probe.enqueue()``
  (whose body returns ``time.time()``) and reads the result back; one sample at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import BENCH_URL, ROOT, SETTLE_SECONDS, admin_connection, quantiles_ms, run_json, stop, wait_until
from bench.intervals import described

PEER_VENV = ROOT / "bench" / ".peers" / "tasksdb-venv"
PEER_REQUIREMENTS = ["django>=5.2,<6", "django-tasks-db[compat]==0.13.*", "psycopg[binary]"]


class Side:
    """One backend: its virtualenv's Python, its settings, its database, its worker command."""

    def __init__(self, name: str, python: Path, settings: str, database: str, worker: list[str]) -> None:
        self.name = name
        self.python = python
        self.settings = settings
        self.database = database
        self.worker = worker

    @property
    def url(self) -> str:
        return BENCH_URL.rsplit("/", 1)[0] + "/" + self.database

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": self.settings,
            "TASKBENCH_DATABASE_URL": self.url,
        }

    def manage(self, *args: str) -> None:
        done = subprocess.run(
            [str(self.python), "-m", "django", *args], cwd=ROOT, env=self.env(), capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: django-admin {' '.join(args)} exited {done.returncode}:\n{done.stderr}")

    def recreate(self) -> None:
        with admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self.manage("migrate", "-v", "0")

    def sql(self, query: str) -> Any:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(query.encode()).fetchone()

    def start_workers(self, count: int) -> list[subprocess.Popen[bytes]]:
        command = [str(self.python), "-m", "django", *self.worker]
        workers = [subprocess.Popen(command, cwd=ROOT, env=self.env()) for _ in range(count)]
        time.sleep(SETTLE_SECONDS + 1.5)  # django-tasks-db's worker waits up to a second before its first poll
        return workers

    def client(self, *args: str) -> Any:
        return run_json([str(self.python), "-m", "bench.taskbench.client", *args], self.env())


OURS = Side(
    "pgbus-workflows",
    Path(sys.executable),
    "bench.taskbench.settings_ours",
    "taskbench_ours",
    ["run_workflow_dispatcher", "--no-sweep", "-v", "0"],
)
PEER = Side(
    "django-tasks-db",
    PEER_VENV / "bin" / "python",
    "bench.taskbench.settings_tasksdb",
    "taskbench_tasksdb",
    ["db_worker", "--no-reload", "-v", "0"],
)
#: The last task's end, per side: ``(finished tasks, epoch seconds of the last end)``.
FINISHED = {
    OURS.name: "SELECT count(*), extract(epoch FROM max(finished_at)) FROM pgbus_workflows_workflowrun"
    " WHERE status = 'finished'",
    PEER.name: "SELECT count(*), extract(epoch FROM max(finished_at)) FROM django_tasks_database_dbtaskresult"
    " WHERE status = 'SUCCESSFUL'",
}


def make_peer_venv() -> None:
    """``bench/.peers/tasksdb-venv`` with django-tasks-db, the first time."""
    if PEER.python.exists():
        return
    subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run([str(PEER.python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True)


def trickle(side: Side, tasks: int, workers: int) -> float:
    """Tasks/s while the client enqueues ``tasks`` one transaction each and ``workers`` workers drain them."""
    side.recreate()
    processes = side.start_workers(workers)
    try:
        report = side.client("trickle", "--tasks", str(tasks))
        wait_until(lambda: side.sql(FINISHED[side.name])[0] >= tasks, 600, f"{tasks} {side.name} tasks")
    finally:
        stop(processes)
    last = float(side.sql(FINISHED[side.name])[1])
    return float(tasks / (last - report["first_call"]))


def latency(side: Side, samples: int) -> list[float]:
    """``samples`` delays from ``enqueue()`` to the body's first line, one idle worker."""
    side.recreate()
    processes = side.start_workers(1)
    try:
        delays: list[float] = side.client("latency", "--samples", str(samples))["latency"]
    finally:
        stop(processes)
    return delays


def main() -> None:
    """Print the tables (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.samples, args.repeat = 300, 30, 1
    make_peer_venv()
    rates: dict[str, list[float]] = {"ours": [], "peer 1": [], "peer 4": []}
    for repetition in range(args.repeat):
        order = [("ours", OURS, 1), ("peer 1", PEER, 1), ("peer 4", PEER, 4)]
        for key, side, workers in order if repetition % 2 == 0 else order[::-1]:
            rates[key].append(trickle(side, args.tasks, workers))
    delays = {side.name: latency(side, args.samples) for side in (OURS, PEER)}
    print(f"| trickle, {args.tasks:,} tasks, {args.repeat} repetitions | tasks/s | ours / it (paired) | interval |")
    print("|---|---:|---:|---|")
    print(f"| pgbus-workflows, one dispatcher (4 threads) | {statistics.median(rates['ours']):,.0f} | 1 | |")
    for key, label in (("peer 1", "one `db_worker`"), ("peer 4", "four `db_worker` processes")):
        ratios = [ours / peer for ours, peer in zip(rates["ours"], rates[key], strict=True)]
        print(
            f"| django-tasks-db, {label} | {statistics.median(rates[key]):,.0f} "
            f"| {statistics.median(ratios):.1f} | {described(ratios)} |"
        )
    print()
    print(f"| idle latency, {args.samples} samples | p50 (ms) | p90 (ms) | p99 (ms) |")
    print("|---|---:|---:|---:|")
    for name, samples in delays.items():
        p50, p90, p99 = quantiles_ms(samples, 50, 90, 99)
        print(f"| {name} | {p50:.1f} | {p90:.1f} | {p99:.1f} |")
    print(json.dumps({"rates": rates}), file=sys.stderr)


if __name__ == "__main__":
    main()
