"""The benchmark's client, in either virtualenv: ``enqueue()`` as a web tier would.

    DJANGO_SETTINGS_MODULE=bench.taskbench.settings_ours python -m bench.taskbench.client trickle --tasks 2000
    DJANGO_SETTINGS_MODULE=bench.taskbench.settings_ours python -m bench.taskbench.client latency --samples 200

``trickle``: ``empty.enqueue()`` back to back, each call its own transaction (autocommit);
prints ``bench.calls.back_to_back``'s report. ``latency``: one ``probe.enqueue()`` at a
time, 10 ms after the previous one ran; prints the seconds from just before each call to the
probe's body (its return value), read back with ``get_result``.
"""

from __future__ import annotations

import argparse
import json
import time

import django


def trickle(tasks: int) -> dict[str, object]:
    """``tasks`` calls of ``empty.enqueue()`` back to back (:func:`bench.calls.back_to_back`)."""
    from bench.calls import back_to_back
    from bench.taskbench.tasks import empty

    return back_to_back(empty.enqueue, tasks)


def latency(samples: int, pause: float = 0.01, poll: float = 0.002) -> dict[str, list[float]]:
    from bench.taskbench.tasks import probe

    delays = []
    for sample in range(samples):
        called = time.time()
        result = probe.enqueue()
        deadline = time.monotonic() + 30
        while not result.is_finished:
            if time.monotonic() > deadline:
                raise TimeoutError(f"probe {sample} did not run in 30 s")
            time.sleep(poll)
            result.refresh()
        delays.append(result.return_value - called)
        time.sleep(pause)
    return {"latency": delays}


def main() -> None:
    """Parse the mode, set Django up, measure, print one JSON document."""
    parser = argparse.ArgumentParser(description=__doc__)
    modes = parser.add_subparsers(dest="mode", required=True)
    modes.add_parser("trickle").add_argument("--tasks", type=int, default=2000)
    modes.add_parser("latency").add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    django.setup()
    print(json.dumps(trickle(args.tasks) if args.mode == "trickle" else latency(args.samples)))


if __name__ == "__main__":
    main()
