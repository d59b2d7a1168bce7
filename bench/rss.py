"""A dispatcher's resident memory: at rest, then while it runs a long stream of steps.

    python -m bench.rss [--steps 300000] [--concurrency 4]

One dispatcher process (``--no-sweep``) starts and registers; after ``REST_SECONDS`` idle its
VmRSS (``/proc/<pid>/status``) is the figure at rest. Then this process feeds it ``steps``
steps (NoOp3 runs, ``start_many()`` of ``BATCH`` at a time, keeping at most
``BACKLOG`` runs unfinished so the dispatcher is never idle and the queue stays short) and
samples its VmRSS every ``EVERY`` seconds. Figures: at rest, after warm-up (the first sample
once 10 % of the steps are done), the largest, and at the end; flat means end / warm-up
within ±10 %.

The default is the issue's 1,000,000 steps: fed by ``start_many()``, the dispatcher drains
them at its backlog rate, some minutes on this machine (``--steps`` for a shorter run).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from bench.common import drop_database, recreate_database, start_dispatchers, stop, wait_registered

#: Seconds a freshly registered dispatcher idles before its memory is read "at rest".
REST_SECONDS = 5.0
#: Runs per start_many(), most runs unfinished at once, seconds between samples.
BATCH, BACKLOG, EVERY = 1000, 4000, 2.0
#: The share of the steps after which a sample counts as warmed up.
WARM_UP = 0.1
#: The steps of one NoOp3 run.
STEPS_PER_RUN = 3
#: The default length of the long run (see the module docstring).
DEFAULT_STEPS = 1_000_000


def rss_mb(pid: int) -> float:
    """The resident set size of process ``pid``, in MB (VmRSS of ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass(frozen=True)
class Memory:
    """What one long run showed: RSS in MB at rest and along the way, with ``(steps done, MB)`` samples."""

    steps: int
    seconds: float
    at_rest: float
    samples: list[tuple[int, float]]

    @property
    def warm(self) -> float:
        """The first sample once ``WARM_UP`` of the steps were done."""
        return next(mb for done, mb in self.samples if done >= WARM_UP * self.steps)

    @property
    def largest(self) -> float:
        """The largest sample."""
        return max(mb for _, mb in self.samples)

    @property
    def end(self) -> float:
        """The last sample, taken once every step was done."""
        return self.samples[-1][1]


def measure(steps: int, concurrency: int = 4) -> Memory:
    """Start one dispatcher, read its RSS at rest, then feed it ``steps`` steps, sampling its RSS."""
    from pgbus_workflows.models import WorkflowRun
    from tests.testapp.workflows import NoOp3

    WorkflowRun.objects.filter(workflow_class=NoOp3.name).delete()
    runs = -(-steps // STEPS_PER_RUN)
    ongoing = WorkflowRun.objects.ongoing().filter(workflow_class=NoOp3.name)  # few rows: cheap to count
    [dispatcher] = start_dispatchers(1, concurrency)
    try:
        wait_registered(1)
        time.sleep(REST_SECONDS)
        at_rest = rss_mb(dispatcher.pid)
        began = time.monotonic()
        started, done, samples, next_sample = 0, 0, [], began
        while done < runs:
            if dispatcher.poll() is not None:
                raise RuntimeError(f"the dispatcher exited with {dispatcher.returncode}")
            if started < runs and started - done < BACKLOG:
                NoOp3.start_many([None] * min(BATCH, runs - started))
                started += min(BATCH, runs - started)
            else:
                time.sleep(0.05)
            done = started - ongoing.count()
            if time.monotonic() >= next_sample:
                samples.append((done * STEPS_PER_RUN, rss_mb(dispatcher.pid)))
                next_sample += EVERY
        seconds = time.monotonic() - began
        samples.append((done * STEPS_PER_RUN, rss_mb(dispatcher.pid)))
    finally:
        stop([dispatcher])
    return Memory(runs * STEPS_PER_RUN, seconds, at_rest, samples)


def main() -> None:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    recreate_database()
    try:
        memory = measure(args.steps, args.concurrency)
    finally:
        drop_database()
    print(f"{memory.steps:,} steps in {memory.seconds:.0f} s; RSS (MB) per steps done:")
    for done, mb in memory.samples:
        print(f"  {done:>9,}  {mb:6.1f}")
    print(
        f"at rest {memory.at_rest:.1f} MB; warm {memory.warm:.1f}, largest {memory.largest:.1f}, "
        f"end {memory.end:.1f} MB (end / warm {memory.end / memory.warm:.2f})"
    )


if __name__ == "__main__":
    main()
