"""A trickle behind runs waiting days for their next step, against one on empty tables.

    .venv/bin/python -m bench.waiting [--waiting 200000] [--runs 2000] [--repeat 3]

A drip campaign parks most of its runs on a wait of days: their next step is scheduled, in the
due index, long before it is due. In a database of its own, made anew for each trickle, each
repetition runs two of ``bench.trickle``'s trickles (one dispatcher of four; a client calls
``NoOp3.start()`` ``--runs`` times, each call its own transaction), in an order that
alternates from one repetition to the next:

- the baseline: empty tables;
- after ``--waiting`` runs of the class ``waits`` were written (in SQL) with their second step
  due in three days or more, and the tables analysed.

Prints each trickle's steps/s and the median of the ratios paired within a repetition.
"""

from __future__ import annotations

import argparse
import time

from bench.common import drop_database, paired_trickles, print_paired


def fill_waiting(count: int) -> float:
    """Write ``count`` ready ``waits`` runs whose step ``after`` is due in three days and more; returns seconds."""
    from django.db import connection

    from pgbus_workflows.models import WorkflowRun, WorkflowStep

    runs, steps = WorkflowRun._meta.db_table, WorkflowStep._meta.db_table
    began = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {runs} (workflow_id, workflow_class, status, current_step, arguments, allow_multiple,
                                paused_reason, created_at, started_at, status_changed_at)
            SELECT gen_random_uuid(), 'waits', 'ready', 'after', '{{}}'::jsonb, false, '', now(), now(), now()
            FROM generate_series(1, %s)
            """,
            [count],
        )
        cursor.execute(
            f"""
            INSERT INTO {steps} (run_id, step_name, attempt, status, outcome, reattempt_reason, queue, priority,
                                 scheduled_at, claimed_by, error_class, error_message, traceback, timed_out,
                                 created_at)
            SELECT r.id, 'after', 1, 'scheduled', '', '', 'workflows', 0,
                   now() + interval '3 days' + r.id * interval '1 second', '', '', '', '', false, now()
            FROM {runs} r WHERE r.workflow_class = 'waits'
            """
        )
        cursor.execute(f"ANALYZE {runs}; ANALYZE {steps}")
    return time.perf_counter() - began


def measure(waiting: int, runs: int, repeat: int) -> tuple[list[float], list[float]]:
    """Steps/s of the baseline trickles and of those behind ``waiting`` runs, paired by repetition."""
    return paired_trickles(runs, repeat, lambda: fill_waiting(waiting))


def main() -> None:
    """Print the table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waiting", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    try:
        plain, behind = measure(args.waiting, args.runs, args.repeat)
    finally:
        drop_database()
    print_paired(
        f"trickle steps/s, 1 dispatcher, concurrency 4 ({args.runs:,} runs)",
        ("empty tables", plain),
        (f"{args.waiting:,} runs waiting days for their next step", behind),
    )


if __name__ == "__main__":
    main()
