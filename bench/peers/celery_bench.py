"""The trickle, idle-latency and crash workloads on Celery with Redis, driven from the project's virtualenv.

The peer runs in a virtualenv of its own (``bench/.peers/celery-venv``, made with ``python -m
venv`` and ``pip install 'celery[redis]>=5.5,<6'`` the first time) on a Redis database of its
own (``BENCH_REDIS_URL``, by default ``redis://127.0.0.1:6379/9``; only that database is ever
flushed). The worker is ``celery worker --pool prefork --concurrency 4`` with Celery's other
defaults; the clients are ``bench.peers.celery_client``. Used as a context manager: every
process is ended and the database flushed on the way out, failure or not.
"""

from __future__ import annotations

import os
import subprocess
import time
from types import TracebackType
from typing import Any

from bench.common import ROOT, SETTLE_SECONDS, run_json, stop, wait_until
from bench.figures import Trickle
from bench.peers.processes import PEERS, crash_fact, ensure_venv, footprint, installed_version, kill_all, spawn

REQUIREMENT = "celery[redis]>=5.5,<6"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
WORKER_LOG = PEERS / "celery-worker.log"
#: The prefork pool's processes.
CONCURRENCY = 4
#: The sleeping task of each crash chain (``bench.peers.celery_client.crash``).
SLEEPING_TASKS = {"default": "crash_sleeps", "acks_late": "crash_sleeps_late"}


def version() -> str:
    """The installed Celery's version."""
    return installed_version(ensure_venv("celery", [REQUIREMENT], "celery"), "celery")


class Celery:
    """The peer's Redis database, and its workers and clients on it (``with Celery() as peer: ...``)."""

    def __init__(self) -> None:
        self.bin = ensure_venv("celery", [REQUIREMENT], "celery")
        self.env = {"CELERY_BENCH_REDIS": REDIS_URL, "PYTHONPATH": str(ROOT)}
        self.workers: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Celery:
        """Empty the benchmark's Redis database."""
        self.client("flush")
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        """End every worker still running, then empty the benchmark's Redis database."""
        stop(self.workers)
        self.client("flush")

    def client(self, *args: str) -> Any:
        """Run ``bench.peers.celery_client ARGS`` in the peer's virtualenv; its JSON report."""
        return run_json([str(self.bin / "python"), "-m", "bench.peers.celery_client", *args], self.env)

    def spawn_worker(self) -> subprocess.Popen[bytes]:
        """``celery worker --pool prefork --concurrency 4`` (warnings only), its output appended to ``WORKER_LOG``.

        Without the bench's ``DJANGO_SETTINGS_MODULE``: the app is no Django project.
        """
        command = [str(self.bin / "celery"), "-A", "bench.peers.celery_app", "worker", "--pool", "prefork"]
        command += ["--concurrency", str(CONCURRENCY), "--loglevel", "WARNING"]
        env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
        worker = spawn(command, {**env, **self.env}, WORKER_LOG, ROOT)
        self.workers.append(worker)
        return worker

    def start_worker(self) -> subprocess.Popen[bytes]:
        """A worker on an empty database, once it said it consumes and settled."""
        self.client("flush")
        worker = self.spawn_worker()
        self.client("ready", "--timeout", "120")
        time.sleep(SETTLE_SECONDS)
        return worker

    def stop_worker(self, worker: subprocess.Popen[bytes]) -> None:
        """SIGTERM the worker (a warm shutdown) and wait for it."""
        stop([worker])
        self.workers.remove(worker)

    def trickle(self, runs: int) -> Trickle:
        """Steps/s while one client sends ``runs`` chains of three tasks and one worker drains them."""
        worker = self.start_worker()
        try:
            report = self.client("trickle", "--runs", str(runs))
        finally:
            self.stop_worker(worker)
        return Trickle.from_report(report, runs, report["last_finished"])

    def latency(self, samples: int) -> tuple[dict[str, list[float]], tuple[int, float]]:
        """The client's report of ``samples`` delays from ``apply_async()`` to the body, idle worker; its footprint."""
        worker = self.start_worker()
        try:
            report: dict[str, list[float]] = self.client("latency", "--samples", str(samples))
            size = footprint(worker.pid)
        finally:
            self.stop_worker(worker)
        return report, size

    def crash(self, seconds: float, bound: float) -> dict[str, dict[str, Any]]:
        """Kill the worker (and its pool) in the sleeping task of two crash chains; what a new worker does.

        One chain's sleeping task is acknowledged on receipt (Celery's default), the other's
        once it returned (``acks_late=True``); both are in the worker when it is killed. Each
        fact notes whether the broker still holds the sleeping task's message at the end of the watch.
        """
        worker = self.start_worker()
        try:
            self.client("crash", "--seconds", str(seconds))

            def both_started() -> bool:
                records = self.client("crashed").values()
                return len(records) >= 2 and all(record["starts"] for record in records)

            wait_until(both_started, 60, "the Celery crash chains' sleeping tasks", 0.2)
            time.sleep(1)
        finally:
            kill_all(worker)
            self.workers.remove(worker)
        restarted = time.time()
        self.spawn_worker()
        report = self.client("crashed", "--until", str(restarted + bound))
        held = self.client("unacked")
        facts = {
            label: crash_fact(len(record["starts"]), record["done"], restarted) for label, record in report.items()
        }
        for label, fact in facts.items():
            where = [name for name in ("unacked", "queued") if SLEEPING_TASKS[label] in held[name]]
            fact["note"] = (
                f"its message then in Redis: {' and '.join(where)}" if where else "its message then gone from Redis"
            )
        return facts
