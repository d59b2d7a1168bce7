"""History benchmark: steps/s with 1,000,000 finished runs in the tables, against empty tables.

    .venv/bin/python -m bench.history [--history 1000000] [--runs 1000]

The claim query lives on a partial index over scheduled steps only, so finished history
should not slow it down: the ratio shows whether it does. The history (runs, three
completed steps and two events each) is written with ``generate_series`` in SQL.
"""

from __future__ import annotations

import argparse
import time

from bench.common import recreate_database
from bench.dispatch import throughput

STEPS = ("a", "b", "c")


def fill_history(count: int) -> float:
    """Insert ``count`` finished runs (class ``history``) with their steps and events; returns seconds."""
    from django.db import connection

    from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep

    runs, steps, events = (m._meta.db_table for m in (WorkflowRun, WorkflowStep, WorkflowEvent))
    began = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {runs} (workflow_id, workflow_class, status, current_step, arguments, allow_multiple,
                                paused_reason, created_at, started_at, finished_at, status_changed_at)
            SELECT gen_random_uuid(), 'history', 'finished', 'c', '{{}}'::jsonb, false, '',
                   now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
                   now() - interval '2 days'
            FROM generate_series(1, %s)
            """,
            [count],
        )
        cursor.execute(
            f"""
            INSERT INTO {steps} (run_id, step_name, attempt, status, outcome, reattempt_reason, queue, priority,
                                 scheduled_at, started_at, finished_at, claimed_by, error_class, error_message,
                                 traceback, timed_out, created_at)
            SELECT r.id, s.name, 1, 'completed', 'success', '', 'workflows', 0, r.created_at, r.created_at,
                   r.created_at, 'history', '', '', '', false, r.created_at
            FROM {runs} r CROSS JOIN unnest(%s::text[]) AS s(name)
            WHERE r.status = 'finished'
            """,
            [list(STEPS)],
        )
        cursor.execute(
            f"""
            INSERT INTO {events} (run_id, kind, transition, from_status, to_status, actor, reason, details, created_at)
            SELECT r.id, e.kind, e.transition, e.source, e.target, 'system', '', '{{}}'::jsonb, r.created_at
            FROM {runs} r CROSS JOIN (
                VALUES ('started', '', '', 'ready'), ('finished', 'finish', 'performing', 'finished')
            ) AS e(kind, transition, source, target)
            WHERE r.status = 'finished'
            """
        )
        cursor.execute(f"ANALYZE {runs}; ANALYZE {steps}; ANALYZE {events}")
    return time.perf_counter() - began


def compare(history: int, runs: int, concurrency: int) -> tuple[float, float]:
    """Steps/s on empty tables, then with ``history`` finished runs (one dispatcher each)."""
    empty = throughput(runs, 1, concurrency)
    fill_history(history)
    full = throughput(runs, 1, concurrency)
    return empty, full


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    recreate_database()
    empty, full = compare(args.history, args.runs, args.concurrency)
    print("| measurement | steps/s | ratio |")
    print("|---|---|---|")
    print(f"| 1 dispatcher, empty tables | {empty:,.0f} | 1.00 |")
    print(f"| 1 dispatcher, {args.history:,} finished runs in the tables | {full:,.0f} | {full / empty:.2f} |")


if __name__ == "__main__":
    main()
