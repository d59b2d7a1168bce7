"""What the sweep's slot repair costs (``limiter_slots``), against the gauge every sweep already sends.

    .venv/bin/python -m bench.slot_repair [--limiters 10000 100000] [--rounds 41]

In a database of its own: ``--limiters`` concurrency limiter rows (one per key that ever
scheduled a step; one in a hundred with a slot in use, held by an attempt in progress, so
every count is right and nothing is repaired), and 2,000 finished runs for the gauge to
count. Each round times the repair (``services.slot_sweep.reconcile``) and the gauge
(``services.stuck.gauge``) one after the other, their order alternating; the figure is the
median of the paired ratios, with its sign-test interval, and the medians in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import drop_database, recreate_database
from bench.intervals import described


def fill(limiters: int) -> None:
    """``limiters`` concurrency limiters, every hundredth in use by an attempt in progress, and finished runs."""
    from django.db import connection

    from pgbus_workflows.models import WorkflowLimiter, WorkflowRun, WorkflowStep

    runs, steps, table = WorkflowRun._meta.db_table, WorkflowStep._meta.db_table, WorkflowLimiter._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {table} (name, kind, "limit", in_use, created_at) '
            "SELECT 'concurrency:bench:' || n, 'concurrency', 1, CASE WHEN n %% 100 = 0 THEN 1 ELSE 0 END, now() "
            "FROM generate_series(1, %s) n",
            [limiters],
        )
        cursor.execute(
            f"""
            WITH new AS (
                INSERT INTO {runs} (workflow_id, workflow_class, status, current_step, arguments, allow_multiple,
                                    paused_reason, created_at, started_at, status_changed_at)
                SELECT gen_random_uuid(), 'keyed_noop', CASE WHEN n %% 100 = 0 THEN 'performing' ELSE 'finished' END,
                       'a', jsonb_build_object('key', n), true, '', now(), now(), now()
                FROM generate_series(1, %s) n RETURNING id, (arguments ->> 'key')::int AS n, status
            )
            INSERT INTO {steps} (run_id, step_name, attempt, status, outcome, reattempt_reason, queue, priority,
                                 scheduled_at, started_at, stall_at, claimed_by, error_class, error_message,
                                 traceback, timed_out, held, holds_slots, limiters, created_at)
            SELECT id, 'a', 1, 'in_progress', '', '', 'default', 0, now(), now(), now() + interval '1 hour',
                   'bench', '', '', '', false, false, false, jsonb_build_array('concurrency:bench:' || n), now()
            FROM new WHERE status = 'performing'
            """,
            [limiters],
        )
        cursor.execute(f"ANALYZE {table}; ANALYZE {steps}; ANALYZE {runs}")


def measure(limiters: int, rounds: int) -> tuple[list[float], float, float]:
    """Paired ratios (repair / gauge) and the two medians in ms, for ``limiters`` limiter rows."""
    recreate_database()  # sets Django up: the engine's modules are imported after it
    from pgbus_workflows.services.slot_sweep import reconcile
    from pgbus_workflows.services.stuck import gauge
    from pgbus_workflows.sql import clock

    fill(limiters)
    repair_s, gauge_s = [], []
    for n in range(rounds):
        timed = []
        for phase in (reconcile, gauge) if n % 2 == 0 else (gauge, reconcile):
            began = time.perf_counter()
            result = phase(clock.now())
            timed.append((phase, time.perf_counter() - began))
            assert phase is not reconcile or result == 0, "a right count was repaired"
        times = dict(timed)
        repair_s.append(times[reconcile])
        gauge_s.append(times[gauge])
    drop_database()
    ratios = [r / g for r, g in zip(repair_s, gauge_s, strict=True)]
    return ratios, statistics.median(repair_s) * 1000, statistics.median(gauge_s) * 1000


def main() -> None:
    """Print the table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limiters", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=41)
    args = parser.parse_args()
    print("| limiters | repair ms | gauge ms | repair / gauge (median, 95% interval) |")
    print("|---:|---:|---:|---|")
    for limiters in args.limiters:
        ratios, repair_ms, gauge_ms = measure(limiters, args.rounds)
        print(f"| {limiters:,} | {repair_ms:.2f} | {gauge_ms:.2f} | {described(ratios)} |")


if __name__ == "__main__":
    main()
