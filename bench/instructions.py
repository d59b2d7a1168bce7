"""Instructions the client side runs per step and per ``start()``, counted by valgrind (callgrind).

    python -m bench.instructions [--runs N]

Wall and CPU times on this machine move by ±15 % between runs of the same code (its speed
moves during the day; see docs/benchmarks.md), which hides a change of a few
per cent. Callgrind counts the instructions a process runs, the same count for the same code
and the same rows, whatever else the machine does. Each measurement is a process of its own
under callgrind, on the bench database made anew with the same rows:

- ``idle``: Django set up, nothing done (subtracted from the others: imports, app loading);
- ``orm``: 5N single-row ORM updates, each its own transaction: the baseline every figure is
  a ratio to (what the same machine and Python spend on Django's plainest write);
- ``start``: 5N ``NoOp3.start()`` calls, each its own transaction (a web request's);
- ``steps``: the worker's path for N three-step runs started before: a claim of one step,
  its body and its outcome's transaction, which claims the run's next step (chained), one
  step at a time, on one thread (no batching: the trickle's case).

Only this process is counted, not PostgreSQL's. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

from bench.common import ROOT, drop_database, recreate_database

#: The three-step runs whose steps are counted.
DEFAULT_RUNS = 200
#: ORM updates and starts are counted this many times as often: each is a few times cheaper
#: than a step, and the idle process's count (subtracted) varies by a few hundred thousand.
CHEAP_FACTOR = 5
_COLLECTED = re.compile(r"Collected : (\d+)")


def work(mode: str, runs: int) -> None:
    """In the process callgrind counts: ``mode``'s work, ``runs`` times."""
    import django

    django.setup()
    from pgbus_workflows.models import WorkflowRun
    from pgbus_workflows.sql import clock
    from tests.testapp.workflows import NoOp3

    if mode == "orm":
        for pk in list(WorkflowRun.objects.values_list("pk", flat=True)[:runs]):
            WorkflowRun.objects.filter(pk=pk).update(status_changed_at=clock.now())
    elif mode == "start":
        for _ in range(runs):
            NoOp3.start()
    elif mode == "steps":
        steps_one_at_a_time()


def steps_one_at_a_time() -> None:
    """Every due step, as a dispatcher's worker runs them in a trickle: a claim of one step, its
    body, its outcome's transaction, which claims the run's next step (chained)."""
    from pgbus_workflows.services.applying import apply_outcomes
    from pgbus_workflows.services.chain import Chain
    from pgbus_workflows.services.claims import claim_and_look_ahead
    from pgbus_workflows.services.executor import perform_step

    chain = Chain("bench")
    while claimed := claim_and_look_ahead(1, None, "bench")[0]:
        while claimed:
            done = perform_step(claimed[0], chain=chain, verify=False)
            apply_outcomes([done] if isinstance(done, tuple) else [], chain)
            claimed = chain.take()


def count(mode: str, runs: int) -> int:
    """Instructions of a process doing ``mode``'s work ``runs`` times, on a database with ``runs`` NoOp3 runs due.

    String hashing is seeded the same in every process: a set's order, and so the work of
    iterating it, is then the same too.
    """
    recreate_database()
    from tests.testapp.workflows import NoOp3

    NoOp3.start_many([{} for _ in range(runs)])
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += [sys.executable, "-m", "bench.instructions", "--work", mode, "--runs", str(runs)]
    environment = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, check=True)
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def measure(runs: int) -> dict[str, float]:
    """Instructions per ORM update, per ``start()`` and per step (the idle process's subtracted)."""
    try:
        idle = count("idle", runs)
        cheap = runs * CHEAP_FACTOR
        per = {
            "orm": (count("orm", cheap) - idle) / cheap,
            "start": (count("start", cheap) - idle) / cheap,
            "step": (count("steps", runs) - idle) / (3 * runs),
        }
    finally:
        drop_database()
    return per


def main() -> None:
    """Count, print a Markdown table (or, with ``--work``, be the counted process)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--work", choices=["idle", "orm", "start", "steps"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.work:
        work(args.work, args.runs)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    per = measure(args.runs)
    print("| measure (callgrind, this process only) | instructions | ratio to an ORM update |")
    print("|---|---:|---:|")
    rows = [
        ("one ORM single-row update, its own transaction (baseline)", "orm"),
        ("one `start()`, its own transaction", "start"),
        ("one step: claim, body, outcome (one at a time, chained)", "step"),
    ]
    for label, key in rows:
        print(f"| {label} | {per[key] / 1e6:.2f} M | {per[key] / per['orm']:.1f} |")


if __name__ == "__main__":
    main()
