"""Quick steps beside slow ones (issue #48): an outcome is written when its step ends, not after its worker's next body.

    .venv/bin/python -m bench.mixed_load [--waves 8] [--repeat 5] [--against REV] [--quick]

Measured in this one run on this machine, in a database of its own made anew for each
measurement:

- **mixed load**: one dispatcher of four; every 2.5 s, for ``--waves`` waves, this process
  starts in one transaction eight ``NoOp1`` runs and, with slow steps, four ``SleepsIO`` runs
  (one 2 s plain step) among them (two no-op runs, then a slow one, four times), so one claim
  takes them together and a worker that has just run a no-op step often takes a slow one
  next; without them (the baseline), the eight no-op runs alone. The no-op steps' time from
  due (``scheduled_at``) to finished: their p99 with slow steps over their p99 without,
  paired by repetition in an alternating order, with the median ratio's sign-test interval;
  with ``--against REV``, the same for ``REV``'s dispatcher.
- **before / after** (``--against REV``): the dispatcher of git revision ``REV`` (a copy made
  with ``git archive``, with this tree's test app) against this tree's, on ``bench.dispatch``'s backlog (1,000 ``NoOp3``
  runs started before one dispatcher of four drains them) and ``bench.trickle``'s trickle
  (500 runs): steps/s, paired by repetition, the ratio this tree / ``REV``.

``--quick`` shrinks every size (a smoke run, not figures to publish).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench import common
from bench.common import quantiles_ms, start_dispatchers, stop, wait_registered, wait_until
from bench.intervals import described
from bench.limits import paired

#: How long each slow step sleeps, and the time between two waves (each wave's slow bodies end within it).
SLOW_SECONDS = 2.0
WAVE_SECONDS = 2.5


def noop_p99_ms(waves: int, slow: bool) -> float:
    """p99 ms from due to finished of the no-op steps of ``waves`` waves, with slow steps among them or not."""
    from django.db import transaction

    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from tests.testapp.async_workflows import SleepsIO
    from tests.testapp.workflows import NoOp1

    [process] = start_dispatchers(1, 4)
    try:
        wait_registered(1)
        time.sleep(common.SETTLE_SECONDS)
        for _ in range(waves):
            with transaction.atomic():  # one commit: claimed together, in this order
                for _ in range(4):
                    NoOp1.start()
                    NoOp1.start()
                    if slow:
                        SleepsIO.start(seconds=SLOW_SECONDS)
            time.sleep(WAVE_SECONDS)
        finished = WorkflowRun.objects.filter(workflow_class=NoOp1.name, status="finished")
        wait_until(lambda: finished.count() >= 8 * waves, 120, f"{8 * waves} NoOp1 runs")
    finally:
        stop([process])
    steps = WorkflowStep.objects.filter(run__workflow_class=NoOp1.name).values_list("scheduled_at", "finished_at")
    [p99] = quantiles_ms([(end - due).total_seconds() for due, end in steps], 99)
    return p99


@contextlib.contextmanager
def dispatchers_of(revision: str) -> Iterator[None]:
    """Dispatchers started meanwhile run the package of git ``revision`` (its copy) with this tree's test app."""
    with tempfile.TemporaryDirectory(prefix="pgw-bench-") as directory:
        archive = subprocess.run(["git", "archive", revision], cwd=common.ROOT, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
        shutil.rmtree(Path(directory) / "tests")
        shutil.copytree(common.ROOT / "tests", Path(directory) / "tests")
        root, common.ROOT = common.ROOT, Path(directory)
        try:
            yield
        finally:
            common.ROOT = root


def before_after(revision: str, measure: Callable[[], float], repeat: int) -> tuple[list[float], list[float]]:
    """``measure`` with ``revision``'s dispatcher (the baseline) and this tree's, paired by repetition."""

    def old() -> float:
        with dispatchers_of(revision):
            return measure()

    return paired(repeat, old, measure)


def row(what: str, baseline: list[float], other: list[float], unit: str) -> str:
    """A Markdown row: medians of both series, the paired ratio's median and interval."""
    ratios = [b / a for a, b in zip(baseline, other, strict=True)]
    medians = f"{statistics.median(baseline):,.0f} | {statistics.median(other):,.0f}"
    return f"| {what} ({unit}) | {medians} | {statistics.median(ratios):.2f} | {described(ratios)} |"


def main() -> None:
    """Print the tables (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waves", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", help="a git revision whose dispatcher is the before/after baseline")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs, trickle_runs = 1000, 500
    if args.quick:
        args.waves, args.repeat, runs, trickle_runs = 3, 2, 200, 100
    common.recreate_database()  # Django set up before the first measurement imports the test app
    alone, beside = paired(
        args.repeat,
        lambda: noop_p99_ms(args.waves, slow=False),
        lambda: noop_p99_ms(args.waves, slow=True),
    )
    title = f"no-op steps, {args.waves} waves, one dispatcher of four, {args.repeat} pairs"
    print(f"| {title} | without slow steps | among 2 s steps | ratio | interval |")
    print("|---|---:|---:|---:|---|")
    print(row("p99 due to finished", alone, beside, "ms"))
    if args.against:
        with dispatchers_of(args.against):
            alone, beside = paired(
                args.repeat,
                lambda: noop_p99_ms(args.waves, slow=False),
                lambda: noop_p99_ms(args.waves, slow=True),
            )
        print(row(f"p99 due to finished, `{args.against}`'s dispatcher", alone, beside, "ms"))
        from bench.dispatch import throughput
        from bench.trickle import trickle

        print()
        print(f"| {args.repeat} pairs, one dispatcher of four | `{args.against}` | this tree | ratio | interval |")
        print("|---|---:|---:|---:|---|")
        backlog = before_after(args.against, lambda: throughput(runs, 1, 4), args.repeat)
        print(row(f"backlog of {runs:,} runs", *backlog, "steps/s"))
        trickled = before_after(args.against, lambda: trickle(trickle_runs, 1, 4).steps_per_s, args.repeat)
        print(row(f"trickle of {trickle_runs:,} runs", *trickled, "steps/s"))
    common.drop_database()


if __name__ == "__main__":
    main()
