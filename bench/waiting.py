"""A trickle behind runs waiting days for their next step (or paused), against one on empty tables.

    .venv/bin/python -m bench.waiting [--waiting 200000 | --paused 20000] [--runs 2000] [--repeat 3]

A drip campaign parks most of its runs on a wait of days: their next step is scheduled, in the
due index, long before it is due. An incident pauses thousands of runs whose steps are due.
In a database of its own, made anew for each trickle, each repetition runs two of
``bench.trickle``'s trickles (one dispatcher of four; a client calls ``NoOp3.start()``
``--runs`` times, each call its own transaction), in an order that alternates from one
repetition to the next:

- the baseline: empty tables;
- after ``--waiting`` runs of the class ``waits`` were written (in SQL) with their second step
  due in three days or more, and the tables analysed; or, with ``--paused``, that many runs
  paused as the pause verb leaves them (their step due an hour ago, held).

Prints each trickle's steps/s and the median of the ratios paired within a repetition. A
trickle's claims are few (its runs' later steps are claimed by their outcomes' transactions),
so ``--paused`` also pairs ``bench.trickle``'s idle latency, where every start is a claim of its
own: ``start()`` call to the body's first line, p50 and p99 of ``--samples`` per database.
"""

from __future__ import annotations

import argparse
import time

from bench.common import drop_database, paired_trickles, print_paired, quantiles_ms, recreate_database


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


def fill_paused(count: int) -> float:
    """Write ``count`` paused ``waits`` runs whose step ``after`` was due an hour ago, held; returns seconds."""
    from django.db import connection

    from pgbus_workflows.models import WorkflowRun, WorkflowStep

    began = time.perf_counter()
    fill_waiting(count)
    runs, steps = WorkflowRun._meta.db_table, WorkflowStep._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {runs} SET status = 'paused', paused_reason = 'incident'")
        cursor.execute(f"UPDATE {steps} SET scheduled_at = now() - interval '1 hour', held = true")
        for name in (runs, steps):
            cursor.execute(f"VACUUM ANALYZE {name}")
    return time.perf_counter() - began


def measure(waiting: int, runs: int, repeat: int, *, paused: bool = False) -> tuple[list[float], list[float]]:
    """Steps/s of the baseline trickles and of those behind ``waiting`` runs (``paused``: paused ones), paired."""
    return paired_trickles(runs, repeat, lambda: (fill_paused if paused else fill_waiting)(waiting))


def paired_latency(paused: int, samples: int, repeat: int) -> list[tuple[str, list[float], list[float]]]:
    """Idle latency (p50, p99 ms) on empty tables and behind ``paused`` paused runs, paired by repetition."""
    from bench.trickle import latency_report

    found: dict[bool, list[list[float]]] = {False: [], True: []}
    for repetition in range(repeat):
        for after in (False, True) if repetition % 2 == 0 else (True, False):
            recreate_database()
            if after:
                fill_paused(paused)
            found[after].append(quantiles_ms(latency_report(samples)["latency"], 50, 99))
    return [
        (name, [each[n] for each in found[False]], [each[n] for each in found[True]])
        for n, name in enumerate(("p50", "p99"))
    ]


def main() -> None:
    """Print the table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--waiting", type=int, default=200_000)
    group.add_argument("--paused", type=int, help="runs paused with their step due, instead of waiting ones")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=200, help="idle latency samples per database (--paused)")
    args = parser.parse_args()
    count = args.paused or args.waiting
    try:
        plain, after = measure(count, args.runs, args.repeat, paused=args.paused is not None)
        latencies = paired_latency(count, args.samples, args.repeat) if args.paused else []
    finally:
        drop_database()
    what = "paused runs whose step is due" if args.paused else "runs waiting days for their next step"
    print_paired(
        f"trickle steps/s, 1 dispatcher, concurrency 4 ({args.runs:,} runs)",
        ("empty tables", plain),
        (f"{count:,} {what}", after),
    )
    for name, empty, behind in latencies:
        print()
        heading = f"idle latency {name}, ms, `start()` call to the body"
        print_paired(heading, ("empty tables", empty), (f"{count:,} {what}", behind), "{:.2f}")


if __name__ == "__main__":
    main()
