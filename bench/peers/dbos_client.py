"""The client of the DBOS benchmark: ``DBOSClient.enqueue()`` as a web tier would (DBOS virtualenv).

    python -m bench.peers.dbos_client trickle --runs 1000
    python -m bench.peers.dbos_client latency --samples 200
    python -m bench.peers.dbos_client crash --seconds 5

Each ``enqueue()`` is one transaction on the system database (``DBOS_BENCH_URL``), onto the
queue ``bench`` that a separate worker process (``bench.peers.dbos_app``) serves. The client
is made (its pool connected) and one enqueue made before measuring. Prints one JSON
document of raw seconds, like ``bench.trickle_client``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import psycopg
from dbos import DBOSClient, EnqueueOptions

from bench.calls import back_to_back

URL = os.environ["DBOS_BENCH_URL"]


def options(workflow: str) -> EnqueueOptions:
    """Enqueue ``workflow`` on the queue ``bench``."""
    return {"queue_name": "bench", "workflow_name": workflow}


def trickle(client: DBOSClient, runs: int) -> dict[str, Any]:
    """``runs`` ``noop3`` enqueued back to back (:func:`bench.calls.back_to_back`)."""
    noop3 = options("noop3")
    return back_to_back(lambda: client.enqueue(noop3), runs)


def latency(client: DBOSClient, samples: int, pause: float = 0.01, poll: float = 0.002) -> dict[str, Any]:
    """Seconds from just before ``enqueue(probe)`` to the first line of its step's body, one at a time.

    Also, per sample, the seconds from the call to its return and to the workflow's
    ``started_at_epoch_ms`` (its dequeue by the worker). The next sample starts ``pause``
    seconds after the previous one's row appears in ``bench_probe`` (polled every ``poll`` s).
    """
    report: dict[str, list[float]] = {"latency": [], "returned": [], "claimed": []}
    query = (
        "SELECT p.body_at, s.started_at_epoch_ms / 1000.0 FROM bench_probe p, dbos.workflow_status s"
        " WHERE p.sample = %s AND s.workflow_uuid = %s"
    )
    probe = options("probe")
    with psycopg.connect(URL, autocommit=True) as conn:
        for sample in range(samples):
            called = time.time()
            handle = client.enqueue(probe, sample)
            returned = time.time()
            deadline = time.monotonic() + 30
            while (row := conn.execute(query, [sample, handle.get_workflow_id()]).fetchone()) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"probe {sample} did not run in 30 s")
                time.sleep(poll)
            report["latency"].append(row[0] - called)
            report["returned"].append(returned - called)
            report["claimed"].append(float(row[1]) - called)
            time.sleep(pause)
    return report


def main() -> None:
    """Parse the mode, make the client, warm it up, measure, print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__)
    modes = parser.add_subparsers(dest="mode", required=True)
    modes.add_parser("trickle").add_argument("--runs", type=int, default=1000)
    modes.add_parser("latency").add_argument("--samples", type=int, default=200)
    modes.add_parser("crash").add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    client = DBOSClient(system_database_url=URL)
    try:
        if args.mode == "crash":
            result: dict[str, Any] = {"workflow_id": client.enqueue(options("crash"), args.seconds).get_workflow_id()}
        else:
            client.enqueue(options("probe"), -1)  # warm: pool connected, statements seen once
            result = trickle(client, args.runs) if args.mode == "trickle" else latency(client, args.samples)
    finally:
        client.destroy()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
