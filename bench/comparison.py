"""pgbus-workflows next to DBOS Transact, Celery and Procrastinate: the same workloads, one run, one machine.

    python -m bench.comparison [--quick] [--peers dbos,celery,procrastinate] [--no-crash]

Each system runs the workloads of ``bench.trickle`` with a client process as a web tier's
and a worker process of its own, on a database (Redis database for Celery) of its own:

- trickle steps/s: the worker starts first; then the client starts ``runs`` three-step runs
  one call (one transaction, one message) at a time; steps/s = 3 x runs / (the last step's
  end - the client's clock before its first call). The systems run in turn within each
  repetition, in an order rotated from one repetition to the next, each after a
  ``CHECKPOINT``; each peer is compared with pgbus-workflows by the median of its paired
  ratios (its rate over pgbus-workflows' in the same repetition) and that median's
  sign-test interval (``bench.intervals``).
- idle latency: one idle worker; the client notes ``time.time()``, starts a one-step run (a
  task) whose body's first line records ``time.time()``; one sample at a time, 10 ms apart;
  p50 / p90 / p99 over all samples, a share of them taken in each repetition.
- the worker's footprint: its processes (a prefork pool's children too) and their resident
  memory together, read after the latency samples.
- the crash (not with ``--no-crash``): the worker is SIGKILLed (with every process of its
  session) while a run's step sleeps 5 s; a new worker starts; the bench watches, for a
  bounded time, whether the killed step runs again and the run ends, and how long after the
  new worker's start. All systems at once, after the measurements (their waits overlap).

``--quick`` shrinks every size (a smoke run, not figures to publish).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench.common import checkpoint, drop_database, python_reference_ms, quantiles_ms, recreate_database, stop
from bench.figures import Trickle, TrickleSummary
from bench.intervals import described
from bench.peers import pgbus_bench
from bench.peers.processes import footprint

REFERENCE = "pgbus-workflows"
PEERS = ("dbos", "celery", "procrastinate")
#: Seconds the crash run's sleeping step sleeps.
CRASH_SLEEP = 5.0
#: How the crash table names Celery's two chains.
CRASH_LABELS = {"default": "default: acknowledged on receipt", "acks_late": "`acks_late=True`"}
#: The sign-test interval's least coverage: five repetitions reach 94 % (the smallest and largest ratio).
CONFIDENCE = 0.9


@dataclass(frozen=True)
class Sizes:
    """How much each measurement does."""

    runs: int
    repeat: int
    latency_samples: int
    #: Seconds the crash fact waits for the run to end after the new worker started.
    crash_bound: float


FULL = Sizes(runs=1000, repeat=5, latency_samples=200, crash_bound=90)
QUICK = Sizes(runs=200, repeat=2, latency_samples=20, crash_bound=15)


@dataclass
class System:
    """One system's driver (``trickle``, ``latency``, maybe ``crash``) and what was measured on it."""

    name: str
    version: str
    driver: Any
    worker: str
    services: str
    trickles: list[Trickle] = field(default_factory=list)
    latency: dict[str, list[float]] = field(default_factory=dict)
    sizes: list[tuple[int, float]] = field(default_factory=list)
    #: The crash facts by run (one run: the label ""; Celery's two chains: "default" and "acks_late").
    crash: dict[str, dict[str, Any]] | None = None


class ProcrastinateDriver:
    """``bench.peers.procrastinate_bench.Procrastinate`` at concurrency 4, with the comparison's interface."""

    def __init__(self) -> None:
        from bench.peers.procrastinate_bench import Procrastinate

        self.peer = Procrastinate()

    def __enter__(self) -> ProcrastinateDriver:
        """Make the peer's database."""
        self.peer.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        """Drop the peer's database."""
        self.peer.__exit__(*exc)

    def trickle(self, runs: int) -> Trickle:
        """The peer's trickle, one worker of concurrency 4."""
        return self.peer.trickle(runs, pgbus_bench.CONCURRENCY)

    def latency(self, samples: int) -> tuple[dict[str, list[float]], tuple[int, float]]:
        """The peer's latency samples, one idle worker of concurrency 4; its footprint before it stops."""
        self.peer.reset()
        worker = self.peer.start_worker(pgbus_bench.CONCURRENCY)
        try:
            report: dict[str, list[float]] = self.peer.client("latency", "--samples", str(samples))
            size = footprint(worker.pid)
        finally:
            stop([worker])
        return report, size


def systems(stack: contextlib.ExitStack, peers: Sequence[str]) -> list[System]:
    """pgbus-workflows and the ``peers`` asked for, each peer's virtualenv made and its database entered."""
    found = [
        System(
            REFERENCE,
            pgbus_bench.version(),
            pgbus_bench.PgbusWorkflows(),
            "`run_workflow_dispatcher --concurrency 4` (threads); client: `NoOp3.start()` (Django ORM)",
            "PostgreSQL",
        )
    ]
    if "dbos" in peers:
        from bench.peers import dbos_bench

        found.append(
            System(
                "DBOS Transact",
                dbos_bench.version(),
                stack.enter_context(dbos_bench.Dbos()),
                "`DBOS.launch()` serving a queue with DBOS's defaults (no concurrency limit: a thread per "
                "workflow; the queue polled every 1 s, not woken by an enqueue); client: `DBOSClient.enqueue()`",
                "PostgreSQL",
            )
        )
    if "celery" in peers:
        from bench.peers import celery_bench

        found.append(
            System(
                "Celery",
                celery_bench.version(),
                stack.enter_context(celery_bench.Celery()),
                "`celery worker --pool prefork --concurrency 4`; client: `chain(a.s(), b.s(), c.s()).apply_async()`",
                "Redis (broker; no result backend)",
            )
        )
    if "procrastinate" in peers:
        from bench.peers import procrastinate_bench

        found.append(
            System(
                "Procrastinate",
                procrastinate_bench.version(),
                stack.enter_context(ProcrastinateDriver()),
                "`procrastinate worker --concurrency 4` (async tasks, LISTEN/NOTIFY); client: `defer()`, "
                "each task deferring the next",
                "PostgreSQL",
            )
        )
    return found


def rotated(items: Sequence[System], repetition: int) -> list[System]:
    """``items`` in the order of ``repetition``: each one first in turn."""
    shift = repetition % len(items)
    return [*items[shift:], *items[:shift]]


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` nearly equal whole shares."""
    return [total // parts + (part < total % parts) for part in range(parts)]


def measure(sizes: Sizes, found: list[System]) -> None:
    """Each repetition: every system's trickle, then its share of latency samples, in a rotated order."""
    for repetition, samples in enumerate(shares(sizes.latency_samples, sizes.repeat)):
        for system in rotated(found, repetition):
            checkpoint()
            system.trickles.append(system.driver.trickle(sizes.runs))
            report, size = system.driver.latency(samples)
            for key, values in report.items():
                system.latency.setdefault(key, []).extend(values)
            system.sizes.append(size)


def crash_all(sizes: Sizes, found: list[System]) -> None:
    """Every system's crash fact, all at once (each waits on its own new worker); errors are recorded."""

    def one(system: System) -> dict[str, dict[str, Any]]:
        if not hasattr(system.driver, "crash"):
            return {"": {"error": "not measured: its benchmark app has no crash task"}}
        try:
            facts: dict[str, Any] = system.driver.crash(CRASH_SLEEP, sizes.crash_bound)
        except Exception as error:
            traceback.print_exc()
            return {"": {"error": f"not measured: {type(error).__name__}: {error}"}}
        return {"": facts} if "rerun" in facts else facts

    with ThreadPoolExecutor(len(found)) as pool:
        for system, fact in zip(found, pool.map(one, found), strict=True):
            system.crash = fact


def ratio_cell(system: System, reference: System) -> str:
    """The median of the paired ratios of ``system``'s trickles to the reference's, and its interval."""
    if system is reference:
        return "1 (the reference)"
    pairs = [
        each.steps_per_s / base.steps_per_s for each, base in zip(system.trickles, reference.trickles, strict=True)
    ]
    return f"{statistics.median(pairs):.2f} ({described(pairs, CONFIDENCE)})"


def latency_cell(report: dict[str, list[float]]) -> str:
    """p50 / p90 / p99 ms of the call-to-body delays."""
    return " / ".join(f"{ms:.1f}" for ms in quantiles_ms(report["latency"], 50, 90, 99))


def count_cell(system: System) -> str:
    """The worker's processes: the most seen in its tree after the latency samples."""
    count = max(size[0] for size in system.sizes)
    return f"{count} process{'es' * (count != 1)}"


def crash_cells(fact: dict[str, Any]) -> list[str]:
    """Killed step ran again; run completed; seconds from the new worker's start to the run's end; a note."""
    if "error" in fact:
        return [fact["error"], "", "", ""]
    seconds = f"{fact['seconds']:.1f}" if fact["seconds"] is not None else "-"
    return [
        "yes" if fact["rerun"] else "**no**",
        "yes" if fact["completed"] else "**no**",
        seconds,
        fact.get("note", ""),
    ]


def print_report(sizes: Sizes, found: list[System]) -> None:
    """The machine, the table of the workloads, the crash table, and the method."""
    reference = found[0]
    print(f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()};")
    print(f"pure-Python reference `sum(range(100_000))`, best of 20: {python_reference_ms():.2f} ms")
    print()
    print(
        f"| system | trickle steps/s (median of {sizes.repeat}) "
        f"| ratio to {REFERENCE} (median of paired ratios; interval) "
        "| client call p50 / p99 ms (CPU ms) | idle latency p50 / p90 / p99 ms "
        "| needs running besides the app (processes started) | worker RSS, MB |"
    )
    print("|---|---:|---|---|---|---|---:|")
    for system in found:
        summary = TrickleSummary.of(system.trickles)
        call = f"{summary.call_p50_ms:.2f} / {summary.call_p99_ms:.2f} ({summary.cpu_ms:.2f})"
        cells = [
            f"{system.name} {system.version}",
            f"{summary.steps_per_s:,.0f}",
            ratio_cell(system, reference),
            call,
            latency_cell(system.latency),
            f"{system.services}; a worker of {count_cell(system)}",
            f"{statistics.median(size[1] for size in system.sizes):.0f}",
        ]
        print("| " + " | ".join(cells) + " |")
    if any(system.crash is not None for system in found):
        print()
        print(
            f"| crash: worker SIGKILLed in a step sleeping {CRASH_SLEEP:.0f} s, a new worker started "
            f"(watched {sizes.crash_bound:.0f} s) | killed step ran again | run completed "
            "| s from the new worker's start to the run's end | observed |"
        )
        print("|---|---|---|---:|---|")
        for system in found:
            for label, fact in (system.crash or {}).items():
                name = f"{system.name} ({CRASH_LABELS.get(label, label)})" if label else system.name
                print("| " + " | ".join([name, *crash_cells(fact)]) + " |")
    print()
    print_method(sizes, found)


def print_method(sizes: Sizes, found: list[System]) -> None:
    """How each system was measured: its worker and client, and the sizes."""
    samples = len(found[0].latency.get("latency", []))
    print(
        f"Method: {sizes.repeat} repetitions, each running every system in turn (the order rotated); per system "
        f"and repetition, a trickle of {sizes.runs:,} three-step runs started one at a time by a client process, "
        f"then a share of the {samples} idle-latency samples. Each worker is started (and ready) before its client."
    )
    for system in found:
        print(f"- {system.name} {system.version}: {system.worker}; needs {system.services}.")
    print(
        "- idle latency: a sample starts 10 ms after the previous one's body ran, so a worker that polls at a "
        "fixed interval (DBOS) finds each sample just after its last poll and takes nearly a whole interval."
    )
    print(
        "- the crash: pgbus-workflows runs `tests.testapp`'s `Slow` (its first of two steps sleeps), with the sweep "
        "and every setting at its default; DBOS a workflow of three steps, the second sleeping; Celery two chains of "
        "three tasks, the second sleeping, one acknowledged on receipt (default), one with `acks_late=True`."
    )


def main() -> None:
    """Measure pgbus-workflows and the peers, side by side, and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    parser.add_argument("--no-crash", action="store_true", help="skip the crash facts")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    peers = [name.strip() for name in args.peers.split(",") if name.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers: {', '.join(unknown)}")
    recreate_database()
    try:
        with contextlib.ExitStack() as stack:
            found = systems(stack, peers)
            measure(sizes, found)
            if not args.no_crash:
                crash_all(sizes, found)
    finally:
        drop_database()
    print_report(sizes, found)


if __name__ == "__main__":
    main()
