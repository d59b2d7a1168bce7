"""The trickle, idle-latency and crash workloads on DBOS Transact, driven from the project's virtualenv.

The peer runs in a virtualenv of its own (``bench/.peers/dbos-venv``, made with ``python -m
venv`` and ``pip install 'dbos>=3.4,<4'`` the first time) on a system database of its own
(``<bench database>_dbos``, migrated by the worker's ``DBOS.launch()``). The worker is
``bench.peers.dbos_app``, one process serving the queue ``bench`` with DBOS's defaults; the
clients are ``bench.peers.dbos_client`` (``DBOSClient.enqueue``). Used as a context manager:
the database is dropped and every process ended on the way out, failure or not.
"""

from __future__ import annotations

import os
import subprocess
import time
from types import TracebackType
from typing import Any

import psycopg

from bench.common import BENCH_URL, ROOT, SETTLE_SECONDS, admin_connection, psql_args, run_json, stop, wait_until
from bench.figures import Trickle
from bench.peers.processes import PEERS, crash_fact, ensure_venv, footprint, installed_version, kill_all, spawn

REQUIREMENT = "dbos>=3.4,<4"
DSN = "postgresql://" + (BENCH_URL + "_dbos").split("://", 1)[1]
WORKER_LOG = PEERS / "dbos-worker.log"


def version() -> str:
    """The installed DBOS Transact's version."""
    return installed_version(ensure_venv("dbos", [REQUIREMENT], "dbos"), "dbos")


class Dbos:
    """The peer's database, and its workers and clients on it (``with Dbos() as peer: ...``)."""

    def __init__(self) -> None:
        self.bin = ensure_venv("dbos", [REQUIREMENT], "dbos")
        self.env = {"DBOS_BENCH_URL": DSN, "PYTHONPATH": str(ROOT)}
        self.name = psql_args(DSN)[1]
        self.workers: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Dbos:
        """Create the database and the bench's tables (DBOS's own are made by the first worker)."""
        with admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.sql("CREATE TABLE bench_probe (sample integer PRIMARY KEY, body_at double precision NOT NULL)")
        self.sql("CREATE TABLE bench_crash (label text NOT NULL, at double precision NOT NULL)")
        self.sql("CREATE TABLE bench_ready (pid integer NOT NULL, at double precision NOT NULL)")
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        """End every worker still running, then drop the database."""
        stop(self.workers)
        with admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def sql(self, query: str, params: list[Any] | None = None) -> Any:
        """The first row of ``query`` on the peer's database (None when it returns no row)."""
        with psycopg.connect(DSN, autocommit=True) as conn:
            cursor = conn.execute(query.encode(), params)
            return cursor.fetchone() if cursor.description else None

    def reset(self) -> None:
        """Forget every workflow of earlier measurements (no worker may be running)."""
        tables = "workflow_status, operation_outputs, workflow_input, workflow_output, notifications"
        if self.sql("SELECT to_regclass('dbos.workflow_status')")[0] is not None:
            self.sql(f"TRUNCATE {', '.join(f'dbos.{name.strip()}' for name in tables.split(','))} CASCADE")
        self.sql("TRUNCATE bench_probe, bench_crash, bench_ready")

    def start_worker(self) -> subprocess.Popen[bytes]:
        """A worker (its output appended to ``WORKER_LOG``), once it has served a first probe and settled."""
        command = [str(self.bin / "python"), "-m", "bench.peers.dbos_app"]
        worker = spawn(command, {**os.environ, **self.env}, WORKER_LOG, ROOT)
        self.workers.append(worker)
        ready = "SELECT count(*) FROM bench_ready WHERE pid = %s"
        wait_until(lambda: self.sql(ready, [worker.pid])[0] > 0, 120, f"a DBOS worker (see {WORKER_LOG})", 0.05)
        time.sleep(SETTLE_SECONDS)
        return worker

    def stop_worker(self, worker: subprocess.Popen[bytes]) -> None:
        """SIGTERM the worker and wait for it."""
        stop([worker])
        self.workers.remove(worker)

    def client(self, *args: str) -> Any:
        """Run ``bench.peers.dbos_client ARGS`` in the peer's virtualenv; its JSON report."""
        return run_json([str(self.bin / "python"), "-m", "bench.peers.dbos_client", *args], self.env)

    def trickle(self, runs: int) -> Trickle:
        """Steps/s while one client enqueues ``runs`` ``noop3`` one transaction each and one worker drains them."""
        self.reset()
        worker = self.start_worker()
        try:
            report = self.client("trickle", "--runs", str(runs))
            done = "SELECT count(*) FROM dbos.workflow_status WHERE name = 'noop3' AND status = 'SUCCESS'"
            wait_until(lambda: self.sql(done)[0] >= runs, 600, f"{runs} DBOS noop3 workflows")
        finally:
            self.stop_worker(worker)
        last = "SELECT max(completed_at_epoch_ms) / 1000.0 FROM dbos.operation_outputs WHERE function_name = 'noop_c'"
        return Trickle.from_report(report, runs, float(self.sql(last)[0]))

    def latency(self, samples: int) -> tuple[dict[str, list[float]], tuple[int, float]]:
        """The client's report of ``samples`` delays from ``enqueue()`` to the body, one idle worker; its footprint."""
        self.reset()
        worker = self.start_worker()
        try:
            report: dict[str, list[float]] = self.client("latency", "--samples", str(samples))
            size = footprint(worker.pid)
        finally:
            self.stop_worker(worker)
        return report, size

    def crash(self, seconds: float, bound: float) -> dict[str, Any]:
        """Kill the worker in the sleeping step of a ``crash`` run; what a new worker does within ``bound`` s."""
        self.reset()
        worker = self.start_worker()
        try:
            self.client("crash", "--seconds", str(seconds))
            started = "SELECT count(*) FROM bench_crash WHERE label = 'b-start'"
            wait_until(lambda: self.sql(started)[0] > 0, 60, "the DBOS crash run's sleeping step")
            time.sleep(1)
        finally:
            kill_all(worker)
            self.workers.remove(worker)
        restarted = time.time()
        command = [str(self.bin / "python"), "-m", "bench.peers.dbos_app"]
        self.workers.append(spawn(command, {**os.environ, **self.env}, WORKER_LOG, ROOT))
        done = "SELECT max(at) FROM bench_crash WHERE label = 'c'"
        deadline = time.monotonic() + bound
        while (finished := self.sql(done)[0]) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        starts = self.sql("SELECT count(*) FROM bench_crash WHERE label = 'b-start'")[0]
        return crash_fact(starts, finished, restarted)
