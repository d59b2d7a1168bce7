"""The Procrastinate app of the peer benchmark (runs in the Procrastinate virtualenv).

    procrastinate --app=bench.peers.procrastinate_app.app worker --concurrency 16

A chain of three tasks, each deferring the next (``chain_a`` defers ``chain_b``, which
defers ``chain_c``): the peer of ``NoOp3``'s three steps. ``probe`` records the time its
body began in ``bench_probe`` (the peer of ``Probe``). Async tasks, as Procrastinate
recommends with a concurrency above 1. The database is ``PROCRASTINATE_BENCH_DSN``.
"""

from __future__ import annotations

import os
import time

from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=os.environ["PROCRASTINATE_BENCH_DSN"]))


@app.task(name="chain_a")
async def chain_a() -> None:
    """The first link: defer the second."""
    await chain_b.defer_async()


@app.task(name="chain_b")
async def chain_b() -> None:
    """The second link: defer the third."""
    await chain_c.defer_async()


@app.task(name="chain_c")
async def chain_c() -> None:
    """The last link: nothing to do (its ``succeeded`` event ends the chain)."""


@app.task(name="probe")
async def probe(sample: int) -> None:
    """Record when this body began, under the client's sample number."""
    body_at = time.time()
    await app.connector.execute_query_async(
        "INSERT INTO bench_probe (sample, body_at) VALUES (%(sample)s, %(body_at)s)", sample=sample, body_at=body_at
    )
