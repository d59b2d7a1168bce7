"""The client of the Procrastinate benchmark: ``defer()`` as a web tier would (Procrastinate virtualenv).

    python -m bench.peers.procrastinate_client trickle --runs 2000
    python -m bench.peers.procrastinate_client latency --samples 200

Synchronous ``defer()`` (Procrastinate's sync connector, a psycopg pool opened before
measuring): each call one transaction. Prints one JSON document of raw seconds, like
``bench.trickle_client``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import psycopg

from bench.calls import back_to_back
from bench.peers.procrastinate_app import app, chain_a, probe


def trickle(runs: int) -> dict[str, Any]:
    """``runs`` chains deferred back to back (:func:`bench.calls.back_to_back`)."""
    return back_to_back(chain_a.defer, runs)


def latency(samples: int, pause: float = 0.01, poll: float = 0.002) -> dict[str, Any]:
    """Seconds from just before ``probe.defer()`` to the first line of its body, one sample at a time.

    Also, per sample, the seconds from the call to its return and to the job's ``started``
    event (its fetch by the worker). The next sample starts ``pause`` seconds after the
    previous one's row appears in ``bench_probe`` (polled every ``poll`` seconds on a
    connection of its own).
    """
    report: dict[str, list[float]] = {"latency": [], "returned": [], "claimed": []}
    query = (
        "SELECT p.body_at, extract(epoch FROM e.at) FROM bench_probe p, procrastinate_events e"
        " WHERE p.sample = %s AND e.job_id = %s AND e.type = 'started'"
    )
    with psycopg.connect(os.environ["PROCRASTINATE_BENCH_DSN"], autocommit=True) as conn:
        for sample in range(samples):
            called = time.time()
            job = probe.defer(sample=sample)
            returned = time.time()
            deadline = time.monotonic() + 30
            while (row := conn.execute(query, [sample, job]).fetchone()) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"probe {sample} did not run in 30 s")
                time.sleep(poll)
            report["latency"].append(row[0] - called)
            report["returned"].append(returned - called)
            report["claimed"].append(float(row[1]) - called)
            time.sleep(pause)
    return report


def main() -> None:
    """Parse the mode, open the app (its pool connects), measure, print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__)
    modes = parser.add_subparsers(dest="mode", required=True)
    modes.add_parser("trickle").add_argument("--runs", type=int, default=2000)
    modes.add_parser("latency").add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    with app.open():
        result = trickle(args.runs) if args.mode == "trickle" else latency(args.samples)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
