"""The client of the Celery benchmark: ``apply_async()`` as a web tier would (Celery virtualenv).

    python -m bench.peers.celery_client trickle --runs 1000   # chains sent back to back, then their ends
    python -m bench.peers.celery_client latency --samples 200
    python -m bench.peers.celery_client flush | ready | crash | crashed --until EPOCH | unacked

Each ``apply_async()`` is one message published to the Redis broker (``CELERY_BENCH_REDIS``).
The producer is connected and one probe sent before measuring. Prints one JSON document of
raw seconds, like ``bench.trickle_client``. ``flush`` empties the benchmark's Redis database
(and only it); ``ready`` waits until a worker said it consumes; ``crash`` sends the crash
chains; ``crashed`` reports what they recorded; ``unacked`` names the tasks of the messages
kombu holds delivered but unacknowledged (its hash ``unacked``) and of those still queued.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from celery import chain

from bench.calls import back_to_back
from bench.peers.celery_app import (
    app,
    chain_a,
    chain_b,
    chain_c,
    crash_last,
    crash_sleeps,
    crash_sleeps_late,
    probe,
    store,
)


def trickle(runs: int, timeout: float = 600) -> dict[str, Any]:
    """``runs`` chains sent back to back (:func:`bench.calls.back_to_back`); then, once all ended, the last end."""
    report = back_to_back(lambda: chain(chain_a.s(), chain_b.s(), chain_c.s()).apply_async(), runs)
    deadline = time.monotonic() + timeout
    while store.llen("bench:ends") < runs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{runs} Celery chains not done in {timeout:.0f} s")
        time.sleep(0.05)
    report["last_finished"] = max(float(end) for end in store.lrange("bench:ends", 0, -1))
    return report


def latency(samples: int, pause: float = 0.01, poll: float = 0.002) -> dict[str, Any]:
    """Seconds from just before ``probe.apply_async()`` to the first line of its body, one at a time.

    Also, per sample, the seconds from the call to its return and to the worker's receipt of
    the message. The next sample starts ``pause`` seconds after the previous one's body
    time appears in ``bench:probe`` (polled every ``poll`` seconds).
    """
    report: dict[str, list[float]] = {"latency": [], "returned": [], "claimed": []}
    for sample in range(samples):
        called = time.time()
        probe.apply_async((sample,))
        returned = time.time()
        deadline = time.monotonic() + 30
        while (body_at := store.hget("bench:probe", str(sample))) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"probe {sample} did not run in 30 s")
            time.sleep(poll)
        received = store.hget("bench:received", str(sample))
        report["latency"].append(float(body_at) - called)
        report["returned"].append(returned - called)
        report["claimed"].append((float(received) if received else float(body_at)) - called)
        time.sleep(pause)
    return report


def crash(seconds: float) -> dict[str, Any]:
    """Two chains whose second task sleeps ``seconds``: ``default`` (acks on receipt) and ``acks_late``."""
    chain(chain_a.s(), crash_sleeps.s("default", seconds), crash_last.s("default")).apply_async()
    chain(chain_a.s(), crash_sleeps_late.s("acks_late", seconds), crash_last.s("acks_late")).apply_async()
    return {"labels": ["default", "acks_late"]}


def crashed(until: float) -> dict[str, Any]:
    """Per crash chain: the times its sleeping task started, and when it reached its end (or null).

    Polled every 0.1 s until both chains reached their end, or the epoch second ``until``.
    """
    while True:
        report = _crash_records()
        if sum(record["done"] is not None for record in report.values()) >= 2 or time.time() >= until:
            return report
        time.sleep(0.1)


def _crash_records() -> dict[str, Any]:
    """What the crash chains recorded so far."""
    report: dict[str, Any] = {}
    for entry in store.lrange("bench:crash", 0, -1):
        label, what, at = entry.decode().split(":")
        record = report.setdefault(label, {"starts": [], "done": None})
        if what == "b-start":
            record["starts"].append(float(at))
        else:
            record["done"] = float(at)
    return report


def wait_ready(timeout: float) -> dict[str, Any]:
    """Until a worker said it consumes (``bench:ready``); ``TimeoutError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while store.get("bench:ready") is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Celery worker ready in {timeout:.0f} s")
        time.sleep(0.05)
    return {"ready": True}


def held() -> dict[str, list[str]]:
    """The tasks of the messages kombu holds delivered but unacknowledged (hash ``unacked``) and still queued."""
    unacked = [json.loads(raw)[0]["headers"]["task"] for raw in store.hvals("unacked")]
    queued = [json.loads(raw)["headers"]["task"] for raw in store.lrange("celery", 0, -1)]
    return {"unacked": unacked, "queued": queued}


def main() -> None:
    """Parse the mode, connect, measure or look, print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__)
    modes = parser.add_subparsers(dest="mode", required=True)
    modes.add_parser("trickle").add_argument("--runs", type=int, default=1000)
    modes.add_parser("latency").add_argument("--samples", type=int, default=200)
    modes.add_parser("crash").add_argument("--seconds", type=float, default=5)
    modes.add_parser("flush")
    modes.add_parser("ready").add_argument("--timeout", type=float, default=120)
    modes.add_parser("crashed").add_argument("--until", type=float, default=0)
    modes.add_parser("unacked")
    args = parser.parse_args()
    result: Any
    if args.mode == "flush":
        store.flushdb()
        result = {"flushed": True}
    elif args.mode == "ready":
        result = wait_ready(args.timeout)
    elif args.mode == "crashed":
        result = crashed(args.until)
    elif args.mode == "unacked":
        result = held()
    elif args.mode == "crash":
        result = crash(args.seconds)
    else:
        with app.producer_or_acquire():
            probe.apply_async((-1,))  # warm: the producer connected
        result = trickle(args.runs) if args.mode == "trickle" else latency(args.samples)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
