"""What a claim costs now that a dispatcher claims only the steps its code can run.

    .venv/bin/python -m bench.claims [--due 5000] [--rounds 200]

In a database of its own: ``--due`` due steps of a class this code has, and (per scenario)
some due steps of a class only newer code has, ahead of them in the claim order (as during
a rolling deploy, when the web tier starts runs the old dispatchers do not know). Each claim
of 100 steps runs in a transaction that is rolled back, so every round claims the same rows.
The baseline is the claim as it was before (its query had no filter and read no names),
measured in the same run; each scenario is reported as a ratio to it (median of the rounds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import drop_database, recreate_database

LIMIT = 100


def insert_due(count: int, workflow_class: str, step_name: str, priority: int) -> None:
    """``count`` ready runs of ``workflow_class``, each with a due scheduled ``step_name``."""
    from django.db import connection

    from pgbus_workflows.models import WorkflowRun, WorkflowStep

    runs, steps = WorkflowRun._meta.db_table, WorkflowStep._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH new AS (
                INSERT INTO {runs} (workflow_id, workflow_class, status, current_step, arguments, allow_multiple,
                                    paused_reason, created_at, started_at, status_changed_at)
                SELECT gen_random_uuid(), %s, 'ready', %s, '{{}}'::jsonb, true, '', now(), now(), now()
                FROM generate_series(1, %s) RETURNING id
            )
            INSERT INTO {steps} (run_id, step_name, attempt, status, outcome, reattempt_reason, queue, priority,
                                 scheduled_at, claimed_by, error_class, error_message, traceback, timed_out,
                                 created_at)
            SELECT id, %s, 1, 'scheduled', '', '', 'workflows', %s, now() - interval '1 minute', '', '', '', '',
                   false, now() FROM new
            """,
            [workflow_class, step_name, count, step_name, priority],
        )
        cursor.execute(f"ANALYZE {runs}; ANALYZE {steps}")


def old_claim(limit: int) -> list[Any]:
    """The claim before dispatchers filtered by their code: the same query without names or filter."""
    from django.db import connection, transaction

    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from pgbus_workflows.services import claims
    from pgbus_workflows.sql import clock

    now = clock.now()
    sql = f"""
        SELECT s.id, s.run_id FROM {WorkflowStep._meta.db_table} s JOIN {WorkflowRun._meta.db_table} r
        ON r.id = s.run_id
        WHERE s.status = 'scheduled' AND s.scheduled_at <= %s AND r.status = 'ready'
        ORDER BY s.priority, s.scheduled_at, s.id LIMIT %s FOR UPDATE OF r SKIP LOCKED
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, [now, limit])
            pairs = [(row[0], row[1]) for row in cursor.fetchall()]
        return claims._claim(pairs, now, "bench")


def new_claim(limit: int) -> list[Any]:
    """The claim as a dispatcher makes it now."""
    from pgbus_workflows.services.claims import claim_due_steps

    return claim_due_steps(limit, claimed_by="bench")


def median_ms(claim: Any, rounds: int) -> float:
    """Median milliseconds of one claim of ``LIMIT`` steps, rolled back each time."""
    from django.db import transaction

    times = []
    for _ in range(rounds):
        with transaction.atomic():
            began = time.perf_counter()
            claimed = claim(LIMIT)
            times.append(time.perf_counter() - began)
            assert len(claimed) == LIMIT, len(claimed)
            assert all(step.run.workflow_class == "noop3" for step in claimed)
            transaction.set_rollback(True)
    return statistics.median(times) * 1000


def measure(due: int, rounds: int) -> list[tuple[str, float]]:
    """``(scenario, median ms)`` rows, the baseline first."""
    recreate_database()
    insert_due(due, "noop3", "a", 0)
    rows = [("before: the claim without names or filter", median_ms(old_claim, rounds))]
    rows.append(("now, every due step known (the normal case)", median_ms(new_claim, rounds)))
    ahead = 0
    for unknown in (100, 1_000, 10_000):
        insert_due(unknown - ahead, "from_newer_code", "x", -1)
        ahead = unknown
        rows.append((f"now, {unknown:,} due steps of a class only newer code has ahead", median_ms(new_claim, rounds)))
    drop_database()
    return rows


def main() -> None:
    """Print the table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--due", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    rows = measure(args.due, args.rounds)
    base = rows[0][1]
    print(f"| claim of {LIMIT} steps ({args.due:,} due, {args.rounds} rounds) | median ms | vs before |")
    print("|---|---:|---:|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} | {ms / base:.2f} |")


if __name__ == "__main__":
    main()
