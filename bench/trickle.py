"""Trickle benchmark (issue #16): runs started one transaction at a time while dispatchers drain them.

    python -m bench.trickle [--quick] [--no-peers] [--rss-steps N]

Measured in this one run on this machine, in databases of its own, each rate also as a ratio
to ``pgbench -N`` (the machine's commit rate) and next to the issue's goal:

- trickle steps/s: dispatchers start and register first; then a client process
  (``bench.trickle_client``) calls ``NoOp3.start()`` ``runs`` times back to back, each call its
  own transaction, as web requests would. Steps/s = 3 x runs / (last step's ``finished_at``
  - the client's clock just before its first call); the median of ``repeat`` repetitions.
  The configurations run in turn within each repetition, in an order rotated from one
  repetition to the next; each other configuration is judged against the first by the median
  of its ratios to the first's rate in the same repetition (a pair measured a minute apart),
  which a slow minute of the machine touches far less than two medians taken apart, and
  by that median's sign-test interval (``bench.intervals``): a median under 1 whose interval
  still holds 1 is "not shown slower". The same client reports each call's wall time (p50,
  p99: ``start()`` while a dispatcher drains) and CPU time.
- idle latency: one idle dispatcher; the client notes ``time.time()``, calls ``Probe.start()``,
  whose body's first line returns ``time.time()`` as its output; one sample at a time, 10 ms
  apart. p50 / p90 / p99.
- ``start()`` at idle: no dispatcher running; wall and CPU time per call and the statements
  Django's cursors send (``connection.execute_wrapper``; BEGIN and COMMIT are psycopg's own).
- dispatcher RSS at rest and over a long run (``bench.rss``).
- the same trickle and idle latency on Procrastinate (``bench.peers.procrastinate_bench``),
  side by side with ours: each repetition runs ours, then the peer's (``measure``).

``--quick`` shrinks every size (a smoke run, not figures to publish).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench import rss
from bench.common import (
    SETTLE_SECONDS,
    checkpoint,
    drop_database,
    pgbench_tps,
    python_reference_ms,
    quantiles_ms,
    recreate_database,
    run_json,
    start_dispatchers,
    stop,
    wait_registered,
    wait_until,
)
from bench.figures import Latency, Trickle, TrickleSummary
from bench.intervals import described, no_slower

#: The trickle configurations: (dispatchers, concurrency of each). The first is the reference.
CONFIGS = ((1, 4), (1, 16), (2, 4))
#: The Procrastinate worker's concurrency (the issue measured it at 16).
PEER_CONCURRENCY = 16
#: The idle dispatcher's concurrency in the latency measurement (the default).
LATENCY_CONCURRENCY = 4


@dataclass(frozen=True)
class Sizes:
    """How much each measurement does."""

    runs: int
    repeat: int
    latency_samples: int
    cost_calls: int
    many_runs: int
    rss_steps: int
    pgbench_seconds: int


FULL = Sizes(
    runs=2000,
    repeat=6,
    latency_samples=200,
    cost_calls=500,
    many_runs=10_000,
    rss_steps=rss.DEFAULT_STEPS,
    pgbench_seconds=10,
)
QUICK = Sizes(
    runs=300, repeat=1, latency_samples=50, cost_calls=100, many_runs=2000, rss_steps=20_000, pgbench_seconds=3
)


def client(*args: str) -> Any:
    """Run ``bench.trickle_client ARGS`` (this project's virtualenv); its JSON report."""
    return run_json([sys.executable, "-m", "bench.trickle_client", *args])


def trickle(runs: int, dispatchers: int, concurrency: int, settings: dict[str, Any] | None = None) -> Trickle:
    """One trickle: ``runs`` NoOp3 runs started by the client while ``dispatchers`` processes drain them.

    ``settings``: the dispatchers' ``PGBUS_WORKFLOWS`` keys.
    """
    from django.db.models import Max

    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.workflows import NoOp3

    WorkflowRun.objects.filter(workflow_class=NoOp3.name).delete()
    checkpoint()
    processes = start_dispatchers(dispatchers, concurrency, settings)
    try:
        wait_registered(dispatchers)
        time.sleep(SETTLE_SECONDS)
        report = client("trickle", "--runs", str(runs))
        finished = WorkflowRun.objects.filter(workflow_class=NoOp3.name, status="finished")
        wait_until(lambda: finished.count() >= runs, 600, f"{runs} NoOp3 runs")
    finally:
        stop(processes)
    last = WorkflowStep.objects.filter(run__workflow_class=NoOp3.name).aggregate(last=Max("finished_at"))["last"]
    return Trickle.from_report(report, runs, last.timestamp())


def latency_report(samples: int, concurrency: int = LATENCY_CONCURRENCY) -> dict[str, list[float]]:
    """The client's report of ``samples`` delays from its ``start()`` call to the body, one idle dispatcher."""
    processes = start_dispatchers(1, concurrency)
    try:
        wait_registered(1)
        time.sleep(SETTLE_SECONDS)
        report: dict[str, list[float]] = client("latency", "--samples", str(samples))
    finally:
        stop(processes)
    return report


@dataclass(frozen=True)
class StartCost:
    """``start()`` with no dispatcher running, per call: p50 wall ms, mean CPU ms, executes and statements."""

    wall_ms: float
    cpu_ms: float
    executes: float
    statements: float
    #: ``start_many()``: runs inserted per second (the median of three calls), and CPU µs per run.
    many_rate: float
    many_cpu_us: float


def start_cost(calls: int, many_runs: int) -> StartCost:
    """``calls`` NoOp3 starts by the client with no dispatcher running, then ``start_many()`` of ``many_runs``."""
    report = client("cost", "--calls", str(calls))
    [wall_ms] = quantiles_ms(report["wall"], 50)
    cpu_ms = statistics.fmean(report["cpu"]) * 1000
    bulk = client("many", "--runs", str(many_runs))
    rate = many_runs / statistics.median(bulk["wall"])
    cpu_us = statistics.median(bulk["cpu"]) / many_runs * 1e6
    executes, statements = report["executes"] / calls, sum(report["statements"].values()) / calls
    return StartCost(wall_ms, cpu_ms, executes, statements, rate, cpu_us)


@dataclass(frozen=True)
class Ours:
    """This project's figures (all but memory)."""

    cost: StartCost
    trickles: dict[tuple[int, int], TrickleSummary]
    #: Each configuration's rate over the first's in the same repetition, repetition by repetition.
    paired: dict[tuple[int, int], list[float]]
    latency: Latency


@dataclass(frozen=True)
class Peer:
    """Procrastinate's figures."""

    version: str
    trickle: TrickleSummary
    latency: Latency


def measure(sizes: Sizes, peers: bool) -> tuple[Ours, Peer | None]:
    """Our figures and, with ``peers``, Procrastinate's (its virtualenv is made the first time).

    Side by side: each repetition runs our trickles, then the peer's, and each half of the
    latency samples is taken from ours, then from the peer, so that a change in the
    machine's speed during the run (another VM on the host, the disk) touches both sides
    alike, not one block of measurements.
    """
    cost = start_cost(sizes.cost_calls, sizes.many_runs)
    ours: dict[tuple[int, int], list[Trickle]] = {config: [] for config in CONFIGS}
    theirs: list[Trickle] = []
    latency: tuple[dict[str, list[float]], dict[str, list[float]]] = ({}, {})
    with contextlib.ExitStack() as stack:
        peer = stack.enter_context(_procrastinate()) if peers else None
        for repetition in range(sizes.repeat):
            for config in rotated(CONFIGS, repetition):
                ours[config].append(trickle(sizes.runs, *config))
            if peer is not None:
                theirs.append(peer.trickle(sizes.runs, PEER_CONCURRENCY))
        for half in (sizes.latency_samples // 2, sizes.latency_samples - sizes.latency_samples // 2):
            _extend(latency[0], latency_report(half))
            if peer is not None:
                _extend(latency[1], peer.latency(half, PEER_CONCURRENCY))
    paired = {
        config: [run.steps_per_s / first.steps_per_s for run, first in zip(runs, ours[CONFIGS[0]], strict=True)]
        for config, runs in ours.items()
    }
    summaries = {config: TrickleSummary.of(runs) for config, runs in ours.items()}
    mine = Ours(cost, summaries, paired, Latency.of(latency[0]))
    if not peers:
        return mine, None
    from bench.peers.procrastinate_bench import version

    return mine, Peer(version(), TrickleSummary.of(theirs), Latency.of(latency[1]))


def rotated(configs: Sequence[tuple[int, int]], repetition: int) -> list[tuple[int, int]]:
    """The configurations in the order of ``repetition``: each one first in turn, none always after another."""
    shift = repetition % len(configs)
    return [*configs[shift:], *configs[:shift]]


def _procrastinate() -> Any:
    from bench.peers.procrastinate_bench import Procrastinate

    return Procrastinate()


def _extend(report: dict[str, list[float]], more: dict[str, list[float]]) -> None:
    """Add the samples of ``more`` to ``report`` (a client's latency report: lists by key)."""
    for key, values in more.items():
        report.setdefault(key, []).extend(values)


#: One table row: measurement, value, ratio to pgbench -N, goal of the issue (and whether it is met).
Row = tuple[str, str, str, str]


def machine_row() -> Row:
    """The pure-Python reference of this machine (``bench.common.python_reference_ms``)."""
    return (
        "machine: pure-Python reference, ms (`sum(range(100_000))`, best of 20)",
        f"{python_reference_ms():.2f}",
        "",
        "",
    )


def verdict(ok: bool) -> str:
    """What the goal column says after the figure."""
    return "yes" if ok else "**no**"


def rows(tps: float, sizes: Sizes, ours: Ours, peer: Peer | None, memory: rss.Memory) -> list[Row]:
    """The table's rows of the issue's measurements."""
    skipped = "skipped (--no-peers)"
    theirs = peer.trickle.steps_per_s if peer else None
    table: list[Row] = []
    for dispatchers, concurrency in CONFIGS:
        rate = ours.trickles[dispatchers, concurrency].steps_per_s
        name = f"trickle steps/s, {dispatchers} dispatcher{'s' * (dispatchers > 1)}, concurrency {concurrency}"
        if (dispatchers, concurrency) == CONFIGS[0]:
            vs = f"{rate / theirs:.2f}x ({verdict(rate >= 3 * theirs)})" if theirs else skipped
            goal = f"≥ 0.30 of pgbench ({verdict(rate >= 0.3 * tps)}); ≥ 3x Procrastinate: {vs}"
        else:
            pairs = ours.paired[dispatchers, concurrency]
            ratio = statistics.median(pairs)
            goal = (
                f"≥ the first: {ratio:.2f}x, median of {len(pairs)} paired ratio{'s' * (len(pairs) != 1)} "
                f"({described(pairs)}) ({no_slower(pairs)})"
            )
        table.append((f"{name} ({sizes.runs:,} runs)", f"{rate:,.0f}", f"{rate / tps:.2f}", goal))
    peer_name = (
        f"Procrastinate{' ' + peer.version if peer else ''} trickle steps/s, 1 worker, concurrency {PEER_CONCURRENCY}"
    )
    table.append((peer_name, f"{theirs:,.0f}", f"{theirs / tps:.2f}", "") if theirs else (peer_name, skipped, "", ""))
    lags = [ours.trickles[config].lag for config in CONFIGS] + ([peer.trickle.lag] if peer else [])
    table.append(
        (
            "trickle: the last step finished, s after the client's last call returned (the rows above, in order)",
            " / ".join(f"{lag:.1f}" for lag in lags) + ("" if peer else " / skipped"),
            "",
            "",
        )
    )

    table.append(
        (
            "`start()` while dispatchers drain, p50 / p99 ms (CPU ms), the three trickles in order",
            "; ".join(calls(ours.trickles[config]) for config in CONFIGS),
            "",
            "",
        )
    )
    peer_calls = calls(peer.trickle) if peer else skipped
    table.append(("Procrastinate `defer()` while its worker drains, p50 / p99 ms (CPU ms)", peer_calls, "", ""))

    ours_at, theirs_at = ours.latency, peer.latency if peer else None
    if theirs_at:
        vs = f"{ours_at.p50 / theirs_at.p50:.2f}x ({verdict(ours_at.p50 <= 0.5 * theirs_at.p50)})"
    else:
        vs = skipped
    table.append(
        (
            f"idle latency, `start()` call to body, p50 / p90 / p99 ms (concurrency {LATENCY_CONCURRENCY})",
            percentiles(ours_at),
            "",
            f"p50 ≤ 0.5x Procrastinate's: {vs}; p99 ≤ 10 ms ({verdict(ours_at.p99 <= 10)})",
        )
    )
    # The floor of the p50 goal: a body cannot start before its start() committed, which is when the call returns.
    floor = f"the call's return alone: {ours_at.phases[0] / theirs_at.p50:.2f}x theirs" if theirs_at else ""
    table.append(("idle latency p50 by phase, ms: call returns + claim + body", phases(ours_at), "", floor))
    name = f"Procrastinate idle latency, `defer()` call to body, p50 / p90 / p99 ms (concurrency {PEER_CONCURRENCY})"
    table.append((name, percentiles(theirs_at) if theirs_at else skipped, "", ""))
    table.append(
        (
            "Procrastinate idle latency p50 by phase, ms: call returns + fetch + body",
            phases(theirs_at) if theirs_at else skipped,
            "",
            "",
        )
    )

    cost = ours.cost
    table.append(
        (
            f"`start()` at idle: p50 ms, CPU ms, statements ({sizes.cost_calls} calls)",
            f"{cost.wall_ms:.2f}, {cost.cpu_ms:.2f}, {cost.statements:.0f} in {cost.executes:.0f} executes",
            "",
            f"p50 ≤ 1 ms ({verdict(cost.wall_ms <= 1)})",
        )
    )
    table.append(
        (
            f"`start_many()` of {sizes.many_runs:,} runs: runs/s (CPU µs per run)",
            f"{cost.many_rate:,.0f} ({cost.many_cpu_us:.0f})",
            f"{cost.many_rate / tps:.2f}",
            f"≥ 10,000 runs/s ({verdict(cost.many_rate >= 10_000)})",
        )
    )
    table.append(
        (
            f"dispatcher RSS at rest, MB (concurrency 4, {rss.REST_SECONDS:.0f} s idle)",
            f"{memory.at_rest:.1f}",
            "",
            f"≤ 80 MB ({verdict(memory.at_rest <= 80)})",
        )
    )
    flat = memory.end / memory.warm
    table.append(
        (
            f"dispatcher RSS over {memory.steps:,} steps, MB: after 10 % / largest / end",
            f"{memory.warm:.1f} / {memory.largest:.1f} / {memory.end:.1f}",
            "",
            f"end ÷ after 10 % within 1 ± 0.10: {flat:.2f} ({verdict(abs(flat - 1) <= 0.1)})",
        )
    )
    return table


def percentiles(latency: Latency) -> str:
    """p50 / p90 / p99 ms."""
    return f"{latency.p50:.1f} / {latency.p90:.1f} / {latency.p99:.1f}"


def phases(latency: Latency) -> str:
    """The median of each phase, ms."""
    return " + ".join(f"{ms:.1f}" for ms in latency.phases)


def calls(summary: TrickleSummary) -> str:
    """p50 / p99 wall ms of the calls, and their mean CPU ms."""
    return f"{summary.call_p50_ms:.1f} / {summary.call_p99_ms:.1f} ({summary.cpu_ms:.2f})"


def print_table(table: list[Row]) -> None:
    """The machine, then the Markdown table."""
    print(f"Machine: {platform.node()}, {platform.processor() or platform.machine()}")
    print()
    print("| measurement | value | vs pgbench -N | goal (issue #16) |")
    print("|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")


def parse_sizes(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, Sizes]:
    """Add ``--quick``, ``--no-peers`` and ``--rss-steps`` to ``parser``; its arguments and the sizes."""
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--no-peers", action="store_true", help="skip Procrastinate (e.g. offline)")
    parser.add_argument("--rss-steps", type=int, help=f"steps of the RSS run (default {rss.DEFAULT_STEPS:,})")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.rss_steps:
        sizes = dataclasses.replace(sizes, rss_steps=args.rss_steps)
    return args, sizes


def main() -> None:
    """Run every measurement of the issue and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args, sizes = parse_sizes(parser)
    recreate_database()
    try:
        tps = pgbench_tps(4, sizes.pgbench_seconds)
        ours, peer = measure(sizes, not args.no_peers)
        memory = rss.measure(sizes.rss_steps)
    finally:
        drop_database()
    table = [("pgbench -N, 4 clients (tps)", f"{tps:,.0f}", "1.00", ""), machine_row()]
    print_table([*table, *rows(tps, sizes, ours, peer, memory)])


if __name__ == "__main__":
    main()
