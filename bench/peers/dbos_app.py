"""The DBOS Transact app of the peer benchmark (runs in the DBOS virtualenv).

    python -m bench.peers.dbos_app   # the worker: launches DBOS and serves the queue ``bench``

``noop3`` is a workflow of three no-op steps (the peer of ``NoOp3``); ``probe`` has one
step that records the time its body began in ``bench_probe`` (the peer of ``Probe``);
``crash`` has three steps, the second sleeping 5 s and recording each of its starts in
``bench_crash`` (the crash fact). The worker registers the queue ``bench`` with DBOS's
defaults (no concurrency limit, polled every second) unless ``DBOS_BENCH_WORKER_CONCURRENCY``
or ``DBOS_BENCH_POLLING`` say otherwise, runs one probe through it, and then writes its pid
to ``bench_ready``. The system database is ``DBOS_BENCH_URL``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg
from dbos import DBOS, DBOSConfig

QUEUE = "bench"
URL = os.environ["DBOS_BENCH_URL"]
_local = threading.local()


def _execute(query: str, params: list[Any]) -> None:
    """Run ``query`` on this thread's autocommit connection to the system database."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(URL, autocommit=True)
    conn.execute(query.encode(), params)


@DBOS.step(name="noop_a")
def noop_a() -> None:
    """The first step: nothing to do."""


@DBOS.step(name="noop_b")
def noop_b() -> None:
    """The second step: nothing to do."""


@DBOS.step(name="noop_c")
def noop_c() -> None:
    """The last step: nothing to do (its ``completed_at_epoch_ms`` ends the run)."""


@DBOS.workflow(name="noop3")
def noop3() -> None:
    """Three no-op steps, one after the other."""
    noop_a()
    noop_b()
    noop_c()


@DBOS.step(name="probe_body")
def probe_body(sample: int) -> None:
    """Record when this body began, under the client's sample number."""
    body_at = time.time()
    _execute("INSERT INTO bench_probe (sample, body_at) VALUES (%s, %s) ON CONFLICT DO NOTHING", [sample, body_at])


@DBOS.workflow(name="probe")
def probe(sample: int) -> None:
    """One step recording when its body began."""
    probe_body(sample)


@DBOS.step(name="crash_sleeps")
def crash_sleeps(seconds: float) -> None:
    """Record this start, then sleep ``seconds`` (the worker is killed meanwhile)."""
    _execute("INSERT INTO bench_crash (label, at) VALUES ('b-start', %s)", [time.time()])
    time.sleep(seconds)


@DBOS.step(name="crash_last")
def crash_last() -> None:
    """Record that the run reached its last step."""
    _execute("INSERT INTO bench_crash (label, at) VALUES ('c', %s)", [time.time()])


@DBOS.workflow(name="crash")
def crash(seconds: float) -> None:
    """A no-op step, a sleeping one, a recording one."""
    noop_a()
    crash_sleeps(seconds)
    crash_last()


def main() -> None:
    """Launch DBOS on ``DBOS_BENCH_URL``, register the queue, say it is ready, serve it until ended."""
    config: DBOSConfig = {"name": "pgbus_bench", "system_database_url": URL, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    concurrency = os.environ.get("DBOS_BENCH_WORKER_CONCURRENCY")
    polling = float(os.environ.get("DBOS_BENCH_POLLING", "1.0"))
    queue = DBOS.register_queue(
        QUEUE,
        worker_concurrency=int(concurrency) if concurrency else None,
        polling_interval_sec=polling,
        on_conflict="always_update",
    )
    queue.enqueue(probe, -2).get_result()  # the queue's thread has dequeued: the worker serves it
    _execute("INSERT INTO bench_ready (pid, at) VALUES (%s, %s)", [os.getpid(), time.time()])
    threading.Event().wait()


if __name__ == "__main__":
    main()
