"""What a finished run takes on disk, by table, indexes included: the figure to size ``RETENTION`` by.

    python -m bench.sizing [--runs N]

On the bench database made anew, ``N`` runs of ``NoOp3`` (three steps, empty bodies, no
arguments) are started with ``start_many()`` and run to their end by a dispatcher
(``run_workflow_dispatcher --once``); after a ``VACUUM ANALYZE``, each table's
``pg_total_relation_size`` (heap, indexes, TOAST) is divided by ``N``. Arguments, outputs and
error tracebacks add their JSON and text to these figures; so does each retry (an attempt is a
row of the steps table, with its events).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from bench.common import ROOT, drop_database, recreate_database

DEFAULT_RUNS = 20_000
CHUNK = 5_000


def run_models() -> list[type]:
    """The models whose rows belong to a run (retention deletes them with it)."""
    from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep

    return [WorkflowRun, WorkflowStep, WorkflowEvent, WorkflowSignal, FanOutJob]


def run_all_due() -> None:
    """A dispatcher that drains what is due, then exits."""
    command = [sys.executable, "-m", "django", "run_workflow_dispatcher", "--once", "--no-sweep", "-v", "0"]
    subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=3600)


def bytes_per_run(runs: int) -> list[tuple[str, float]]:
    """``(table, bytes per finished run)`` of the app's tables that hold rows, the largest first."""
    from django.db import connection

    from pgbus_workflows.models import WorkflowRun
    from tests.testapp.workflows import NoOp3

    for start in range(0, runs, CHUNK):
        NoOp3.start_many([{} for _ in range(min(CHUNK, runs - start))])
    run_all_due()
    finished = WorkflowRun.objects.filter(status="finished").count()
    if finished != runs:
        raise RuntimeError(f"{finished} of {runs} runs finished")
    tables = [model._meta.db_table for model in run_models()]
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f'VACUUM ANALYZE "{table}"')
        sizes = []
        for table in tables:
            cursor.execute(f'SELECT pg_total_relation_size(%s), (SELECT count(*) FROM "{table}")', [table])
            size, rows = cursor.fetchone()
            if rows:
                sizes.append((table, size / runs))
    return sorted(sizes, key=lambda pair: -pair[1])


def main() -> None:
    """Measure and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"finished runs measured ({DEFAULT_RUNS})")
    args = parser.parse_args()
    recreate_database()
    try:
        sizes = bytes_per_run(args.runs)
    finally:
        drop_database()
    print(f"{args.runs} finished runs of three empty steps, after VACUUM ANALYZE:\n")
    print("| table | bytes per run |\n|---|---:|")
    for table, size in sizes:
        print(f"| `{table}` | {size:,.0f} |")
    total = sum(size for _table, size in sizes)
    print(f"| all | {total:,.0f} |")
    print(f"\nA million such runs: {total * 1e6 / 2**30:.2f} GiB.")


if __name__ == "__main__":
    main()
