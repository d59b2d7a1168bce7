"""Every benchmark in one run, one Markdown table: the figures of the README's performance section.

    .venv/bin/python -m bench.run_all [--quick]

Measured in this one run on this machine, in a database of its own: pgbench's simple-update
tps (the machine's commit rate, the baseline every ratio divides by), steps/s with one and
two dispatchers and with batching off (``BATCH_SIZE`` 1), fan-out drain jobs/s, idle
start-to-first-step latency, and steps/s with 1,000,000 finished runs in the tables against
empty tables. Steps/s are the median of three measurements (one lasts about a second).
``--quick`` shrinks every size (a smoke run, not figures to publish).
"""

from __future__ import annotations

import argparse
import platform

from bench.common import drop_database, pgbench_tps, recreate_database
from bench.dispatch import latency, median_throughput
from bench.fanout import drain
from bench.history import compare


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    runs, jobs, history, samples, seconds = (
        (200, 1000, 20_000, 50, 3) if args.quick else (1000, 10_000, 1_000_000, 200, 10)
    )
    c = args.concurrency

    recreate_database()
    try:
        tps = pgbench_tps(c, seconds)
        one = median_throughput(runs, 1, c)
        two = median_throughput(runs, 2, c)
        unbatched = median_throughput(runs, 1, c, {"BATCH_SIZE": 1})
        p50, p99 = latency(samples)
        insert, drained = drain(jobs, 1, c)
        empty, full = compare(history, runs, c)
    finally:
        drop_database()
    rows = [
        (f"pgbench -N, {c} clients (tps)", f"{tps:,.0f}", "1.00"),
        (f"steps/s, 1 dispatcher ({runs} three-step runs)", f"{one:,.0f}", f"{one / tps:.2f}"),
        (f"steps/s, 2 dispatchers ({runs} three-step runs)", f"{two:,.0f}", f"{two / tps:.2f}"),
        ("steps/s, 1 dispatcher, BATCH_SIZE 1 (a commit per step)", f"{unbatched:,.0f}", f"{unbatched / tps:.2f}"),
        (f"fan-out insert, jobs/s ({jobs:,} jobs)", f"{insert:,.0f}", f"{insert / tps:.2f}"),
        (f"fan-out drain, jobs/s, 1 dispatcher ({jobs:,} jobs)", f"{drained:,.0f}", f"{drained / tps:.2f}"),
        ("idle start-to-first-step latency p50 / p99 (ms)", f"{p50:.1f} / {p99:.1f}", ""),
        ("steps/s, 1 dispatcher, empty tables", f"{empty:,.0f}", f"{empty / tps:.2f}"),
        (
            f"steps/s, 1 dispatcher, {history:,} finished runs",
            f"{full:,.0f}",
            f"{full / tps:.2f} ({full / empty:.2f} of empty)",
        ),
    ]
    print(f"Machine: {platform.node()}, {platform.processor() or platform.machine()}, concurrency {c} per dispatcher")
    print()
    print("| measurement | value | vs pgbench -N |")
    print("|---|---|---|")
    for name, value, ratio in rows:
        print(f"| {name} | {value} | {ratio} |")


if __name__ == "__main__":
    main()
