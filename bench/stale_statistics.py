"""A trickle on tables whose statistics say they are nearly empty, against one on tables never analysed.

    .venv/bin/python -m bench.stale_statistics [--runs 2000] [--repeat 3]

In a database of its own, made anew for each trickle, each repetition runs two of
``bench.trickle``'s trickles (one dispatcher of four; a client calls ``NoOp3.start()``
``--runs`` times, each call its own transaction), in an order that alternates from one
repetition to the next:

- the baseline: new tables, never analysed (the planner estimates their rows from their
  size on disk);
- after 300 runs were started and all but one deleted, and the tables vacuumed: VACUUM
  counts the one row left over the pages that held the 300, and the planner, taking that
  density, expects a row or so in each table however much the trickle puts in them (as
  after a night's retention emptied them, until autovacuum's next ANALYZE).

Prints each trickle's steps/s and the median of the ratios paired within a repetition.
"""

from __future__ import annotations

import argparse

from bench.common import drop_database, paired_trickles, print_paired

#: The runs started, then deleted but one, before the VACUUM.
EMPTIED = 300


def empty_and_vacuum() -> None:
    """Leave one run in tables that held ``EMPTIED`` and vacuum them (as retention and autovacuum would)."""
    from django.db import connection

    from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
    from tests.testapp.workflows import NoOp1

    WorkflowRun.objects.all().delete()
    NoOp1.start_many([{} for _ in range(EMPTIED)])
    WorkflowRun.objects.exclude(pk=WorkflowRun.objects.latest("pk").pk).delete()
    with connection.cursor() as cursor:
        for model in (WorkflowRun, WorkflowStep, WorkflowEvent):
            cursor.execute(f"VACUUM {connection.ops.quote_name(model._meta.db_table)}")


def measure(runs: int, repeat: int) -> tuple[list[float], list[float]]:
    """Steps/s of the baseline trickles and of those after :func:`empty_and_vacuum`, paired by repetition."""
    return paired_trickles(runs, repeat, empty_and_vacuum)


def main() -> None:
    """Print the table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    try:
        plain, vacuumed = measure(args.runs, args.repeat)
    finally:
        drop_database()
    print_paired(
        f"trickle steps/s, 1 dispatcher, concurrency 4 ({args.runs:,} runs)",
        ("tables never analysed", plain),
        ("emptied and vacuumed first", vacuumed),
    )


if __name__ == "__main__":
    main()
