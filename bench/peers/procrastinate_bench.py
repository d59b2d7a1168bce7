"""The trickle and idle-latency workloads on Procrastinate, driven from the project's virtualenv.

The peer runs in a virtualenv of its own (``bench/.peers/procrastinate-venv``, made with
``python -m venv`` and ``pip install 'procrastinate[psycopg]>=3.10,<4'`` the first time) on a
database of its own (``<bench database>_procrastinate``, its schema applied with
``procrastinate schema --apply``). The worker is ``procrastinate worker`` with its defaults
(LISTEN/NOTIFY on, polling every 5 s as a fallback) but for ``--concurrency``; the clients are
``bench.peers.procrastinate_client``. Used as a context manager: the database is dropped and
every process ended on the way out, failure or not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from bench.common import BENCH_URL, ROOT, SETTLE_SECONDS, admin_connection, psql_args, run_json, stop, wait_until
from bench.figures import Trickle

VENV = ROOT / "bench" / ".peers" / "procrastinate-venv"
REQUIREMENT = "procrastinate[psycopg]>=3.10,<4"
APP = "bench.peers.procrastinate_app.app"
DSN = BENCH_URL + "_procrastinate"
WORKER_LOG = VENV.parent / "procrastinate-worker.log"


def ensure_venv() -> Path:
    """The peer virtualenv's bin directory, after creating it and installing Procrastinate if needed."""
    bin_dir = VENV / "bin"
    if not (bin_dir / "procrastinate").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(bin_dir / "pip"), "install", "-q", REQUIREMENT], check=True)
    return bin_dir


def version() -> str:
    """The installed Procrastinate's version."""
    out = subprocess.run([str(ensure_venv() / "procrastinate"), "--version"], capture_output=True, text=True)
    return out.stdout.strip().split()[-1] if out.returncode == 0 else "?"


class Procrastinate:
    """The peer's database, and its workers and clients on it (``with Procrastinate() as peer: ...``)."""

    def __init__(self) -> None:
        self.bin = ensure_venv()
        self.env = {"PROCRASTINATE_BENCH_DSN": DSN, "PYTHONPATH": str(ROOT)}
        self.name = psql_args(DSN)[1]

    def __enter__(self) -> Procrastinate:
        """Create the database, apply Procrastinate's schema and make the probe table."""
        with admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.cli("schema", "--apply")
        self.sql("CREATE TABLE bench_probe (sample integer PRIMARY KEY, body_at double precision NOT NULL)")
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        """Drop the database."""
        with admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def command(self, *args: str) -> list[str]:
        """``procrastinate --log-level=warning --app=bench.peers.procrastinate_app.app ARGS``.

        Warnings only, like the dispatchers' ``-v 0``: at its default level (INFO) the CLI logs
        two lines per job.
        """
        return [str(self.bin / "procrastinate"), "--log-level=warning", f"--app={APP}", *args]

    def cli(self, *args: str) -> None:
        """Run ``procrastinate ARGS`` to its end (its output shown only if it fails)."""
        done = subprocess.run(self.command(*args), cwd=ROOT, env=self.environ(), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"procrastinate {' '.join(args)} exited {done.returncode}:\n{done.stderr}")

    def environ(self) -> dict[str, str]:
        """The environment of the peer's processes."""
        return {**os.environ, **self.env}

    def sql(self, query: str, params: list[Any] | None = None) -> Any:
        """The first row of ``query`` on the peer's database (None when it returns no row)."""
        with psycopg.connect(DSN, autocommit=True) as conn:
            cursor = conn.execute(query.encode(), params)
            return cursor.fetchone() if cursor.description else None

    def reset(self) -> None:
        """Forget every job, event and worker of earlier measurements (no worker may be running)."""
        self.sql("TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers, bench_probe CASCADE")

    def start_worker(self, concurrency: int) -> subprocess.Popen[bytes]:
        """A worker (its output appended to ``WORKER_LOG``), once it has registered and settled."""
        command = self.command("worker", "--concurrency", str(concurrency))
        with WORKER_LOG.open("ab") as log:
            worker = subprocess.Popen(command, cwd=ROOT, env=self.environ(), stdout=log, stderr=log)
        try:
            registered = "SELECT count(*) FROM procrastinate_workers"
            wait_until(lambda: self.sql(registered)[0] > 0, 120, f"a Procrastinate worker (see {WORKER_LOG})", 0.05)
        except BaseException:
            stop([worker])
            raise
        time.sleep(SETTLE_SECONDS)
        return worker

    def client(self, *args: str) -> Any:
        """Run ``bench.peers.procrastinate_client ARGS`` in the peer's virtualenv; its JSON report."""
        return run_json([str(self.bin / "python"), "-m", "bench.peers.procrastinate_client", *args], self.env)

    def trickle(self, runs: int, concurrency: int) -> Trickle:
        """Steps/s while one client defers ``runs`` chains one transaction each and one worker drains them."""
        self.reset()
        worker = self.start_worker(concurrency)
        try:
            report = self.client("trickle", "--runs", str(runs))
            done = "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'chain_c' AND status = 'succeeded'"
            wait_until(lambda: self.sql(done)[0] >= runs, 600, f"{runs} Procrastinate chains")
        finally:
            stop([worker])
        last = self.sql(
            "SELECT extract(epoch FROM max(e.at)) FROM procrastinate_events e"
            " JOIN procrastinate_jobs j ON j.id = e.job_id WHERE j.task_name = 'chain_c' AND e.type = 'succeeded'"
        )[0]
        return Trickle.from_report(report, runs, float(last))

    def latency(self, samples: int, concurrency: int) -> dict[str, list[float]]:
        """The client's report of ``samples`` delays from ``defer()`` to the body's first line, one idle worker."""
        self.reset()
        worker = self.start_worker(concurrency)
        try:
            report: dict[str, list[float]] = self.client("latency", "--samples", str(samples))
        finally:
            stop([worker])
        return report
