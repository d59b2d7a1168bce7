"""Every benchmark in one run, one Markdown table: the figures of the docs' benchmarks page (docs/benchmarks.md).

    .venv/bin/python -m bench.run_all [--quick] [--no-peers] [--rss-steps N] [--scale RUNS]

Measured in this one run on this machine, in databases of its own: pgbench's simple-update
tps (the machine's commit rate, the baseline every ratio divides by); backlog steps/s (runs
started before the dispatchers) with one and two dispatchers and with batching off
(``BATCH_SIZE`` 1); fan-out insert and drain jobs/s; the trickle measurements of issue #16
(``bench.trickle``: steps/s while a client starts runs one transaction each, ``start()``'s
cost and latency, call-to-body latency at idle, dispatcher memory, and the same workloads on
Procrastinate unless ``--no-peers``); backlog steps/s with 1,000,000 finished runs in the
tables against empty tables; the trickle behind 200,000 runs waiting days for their next
step against one on empty tables (``bench.waiting``, paired); and idle latency behind 20,000
paused runs whose steps are due against empty tables (``bench.waiting --paused``, paired);
then what each operation costs the primary, counted (``bench.capacity``: round trips,
statements, commits, WAL bytes, the server's CPU), a second table.
Steps/s are the median of three measurements. ``--quick``
shrinks every size (a smoke run, not figures to publish). ``--scale RUNS`` adds
``bench.scale``'s tables last: the engine and the operator's pages behind ``RUNS`` finished
runs and a tenth as many waiting (10,000,000 for the issue's figures: about an hour here).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from bench import capacity, rss
from bench.common import drop_database, paired_median, pgbench_tps, recreate_database
from bench.dispatch import median_throughput
from bench.fanout import drain
from bench.history import compare
from bench.trickle import Row, machine_row, measure, parse_sizes, print_table, rows
from bench.waiting import measure as measure_waiting
from bench.waiting import paired_latency


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=4, help="of each dispatcher in the backlog rows (4)")
    parser.add_argument("--scale", type=int, metavar="RUNS", help="bench.scale behind RUNS finished runs, last")
    args, sizes = parse_sizes(parser)
    runs, jobs, history = (200, 1000, 20_000) if args.quick else (1000, 10_000, 1_000_000)
    waiting = (20_000, 1) if args.quick else (200_000, 3)  # runs waiting days, repetitions
    paused = (2_000, 50, 1) if args.quick else (20_000, 200, 3)  # paused runs, latency samples, repetitions
    c = args.concurrency

    recreate_database()
    try:
        tps = pgbench_tps(c, sizes.pgbench_seconds)
        one = median_throughput(runs, 1, c)
        two = median_throughput(runs, 2, c)
        unbatched = median_throughput(runs, 1, c, {"BATCH_SIZE": 1})
        insert, drained = drain(jobs, 1, c)
        ours, peer = measure(sizes, not args.no_peers)
        empty, full = compare(history, runs, c)
        memory = rss.measure(sizes.rss_steps)
        plain, behind = measure_waiting(waiting[0], runs, waiting[1])
        (_, empty_p50, paused_p50), _ = paired_latency(*paused)
    finally:
        drop_database()
    table: list[Row] = [
        (f"pgbench -N, {c} clients (tps)", f"{tps:,.0f}", "1.00", ""),
        machine_row(),
        (f"backlog steps/s, 1 dispatcher ({runs} three-step runs)", f"{one:,.0f}", f"{one / tps:.2f}", ""),
        (f"backlog steps/s, 2 dispatchers ({runs} three-step runs)", f"{two:,.0f}", f"{two / tps:.2f}", ""),
        (
            "backlog steps/s, 1 dispatcher, `BATCH_SIZE` 1 (a commit per step)",
            f"{unbatched:,.0f}",
            f"{unbatched / tps:.2f}",
            "",
        ),
        (f"fan-out insert, jobs/s ({jobs:,} jobs)", f"{insert:,.0f}", f"{insert / tps:.2f}", ""),
        (f"fan-out drain, jobs/s, 1 dispatcher ({jobs:,} jobs)", f"{drained:,.0f}", f"{drained / tps:.2f}", ""),
        ("backlog steps/s, 1 dispatcher, empty tables", f"{empty:,.0f}", f"{empty / tps:.2f}", ""),
        (
            f"backlog steps/s, 1 dispatcher, {history:,} finished runs",
            f"{full:,.0f}",
            f"{full / tps:.2f} ({full / empty:.2f} of empty)",
            "",
        ),
        (
            f"trickle steps/s, 1 dispatcher of 4, behind {waiting[0]:,} runs waiting days ({runs:,} runs)",
            f"{statistics.median(behind):,.0f}",
            f"{statistics.median(behind) / tps:.2f} ({paired_median(plain, behind):.2f} of empty, paired)",
            "",
        ),
        (
            f"idle latency p50, ms, behind {paused[0]:,} paused runs whose steps are due",
            f"{statistics.median(paused_p50):.2f}",
            f"{paired_median(empty_p50, paused_p50):.2f} of empty, paired",
            "",
        ),
        *rows(tps, sizes, ours, peer, memory),
    ]
    print_table(table)
    print()
    print(f"Backlog rows: concurrency {c} per dispatcher.")
    print()
    capacity.print_table(capacity.measure(100 if args.quick else capacity.DEFAULT_RUNS))
    if args.scale:
        print(flush=True)
        command = ["--runs", str(args.scale), "--waiting", str(max(1, args.scale // 10))]
        subprocess.run([sys.executable, "-m", "bench.scale", *command], check=True)


if __name__ == "__main__":
    main()
