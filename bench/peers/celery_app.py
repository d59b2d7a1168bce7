"""The Celery app of the peer benchmark (runs in the Celery virtualenv).

    celery -A bench.peers.celery_app worker --concurrency 4 --pool prefork

The broker is Redis, database ``CELERY_BENCH_REDIS`` (no result backend: results are
ignored). ``chain_a``, ``chain_b`` and ``chain_c`` are no-op tasks that the client chains
(``chain(a.s(), b.s(), c.s())``, the peer of ``NoOp3``'s three steps); ``chain_c`` appends
the time it ended to the list ``bench:ends``. ``probe`` writes the time its body began to
the hash ``bench:probe`` (the peer of ``Probe``); the worker's main process writes when it
received the probe's message to ``bench:received``. ``crash_sleeps`` (acknowledged on
receipt, Celery's default) and ``crash_sleeps_late`` (``acks_late=True``) record each start
in ``bench:crash`` and sleep; ``crash_last`` records that the chain reached its end. The
worker sets ``bench:ready`` once it is ready to consume.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_received, worker_ready

URL = os.environ["CELERY_BENCH_REDIS"]
app = Celery("pgbus_bench", broker=URL)
app.conf.task_ignore_result = True
store = redis.Redis.from_url(URL)


@app.task(name="chain_a")
def chain_a(previous: Any = None) -> None:
    """The first link: nothing to do."""


@app.task(name="chain_b")
def chain_b(previous: Any = None) -> None:
    """The second link: nothing to do."""


@app.task(name="chain_c")
def chain_c(previous: Any = None) -> None:
    """The last link: append when it ended to ``bench:ends``."""
    store.rpush("bench:ends", time.time())


@app.task(name="probe")
def probe(sample: int) -> None:
    """Record when this body began, under the client's sample number."""
    body_at = time.time()
    store.hset("bench:probe", str(sample), body_at)


@app.task(name="crash_sleeps")
def crash_sleeps(previous: Any, label: str, seconds: float) -> None:
    """Record this start under ``label``, then sleep ``seconds`` (the worker is killed meanwhile)."""
    store.rpush("bench:crash", f"{label}:b-start:{time.time()}")
    time.sleep(seconds)


@app.task(name="crash_sleeps_late", acks_late=True)
def crash_sleeps_late(previous: Any, label: str, seconds: float) -> None:
    """:func:`crash_sleeps`, its message acknowledged only once it returned."""
    store.rpush("bench:crash", f"{label}:b-start:{time.time()}")
    time.sleep(seconds)


@app.task(name="crash_last")
def crash_last(previous: Any, label: str) -> None:
    """Record that the chain labelled ``label`` reached its last task."""
    store.rpush("bench:crash", f"{label}:c:{time.time()}")


@task_received.connect
def _received(request: Any = None, **kwargs: Any) -> None:
    """In the worker's main process: when a probe's message arrived (the peer of a claim)."""
    if request is not None and request.name == "probe":
        store.hset("bench:received", str(request.args[0]), time.time())


@worker_ready.connect
def _ready(**kwargs: Any) -> None:
    """Tell the bench the worker consumes."""
    store.set("bench:ready", time.time())
