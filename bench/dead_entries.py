"""A claim of one due step behind index entries the vacuum has not removed yet.

    .venv/bin/python -m bench.dead_entries [--gone 30000] [--rounds 100]

In a database of its own whose tables were never analyzed (as a new install's are, or as
statistics from before a burst look to the planner), with autovacuum off for them: ``--gone``
runs are started and deleted, which leaves their steps' entries in the partial due index
until a vacuum; then one run is started. Each round claims its step as a dispatcher does
(autocommit) and puts it back. The baseline is the same claim statement planned as
PostgreSQL picks by itself (bitmap scans allowed), measured first in the same run (an index
scan marks the dead entries it meets, which would spare a bitmap scan after it); the
second figure is the claim as the engine sends it, planned without bitmap scans. Then the
same with no step gone: what the setting costs where there is nothing to gain.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import drop_database, recreate_database


def leave_dead_entries(gone: int) -> None:
    """Start ``gone`` runs and delete them, autovacuum off for the tables; then start the one to claim."""
    from django.db import connection

    from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
    from tests.testapp.workflows import NoOp3

    with connection.cursor() as cursor:
        for model in (WorkflowRun, WorkflowStep, WorkflowEvent):
            cursor.execute(f"ALTER TABLE {model._meta.db_table} SET (autovacuum_enabled = off)")
    NoOp3.start_many([{} for _ in range(gone)])
    WorkflowRun.objects.all().delete()
    NoOp3.start()


def as_planned(text: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """The claim statement run as PostgreSQL plans it by itself (the baseline)."""
    from pgbus_workflows import sql

    with sql.bound_cursor() as cursor:
        cursor.execute(text, params)
        return list(cursor.fetchall())


def median_ms(rounds: int, planner_pick: bool) -> float:
    """Median milliseconds of one claim of the due step, put back after each round."""
    from django.db import connection

    from pgbus_workflows import sql
    from pgbus_workflows.models import WorkflowRun, WorkflowStep
    from pgbus_workflows.services.claims import claim_due_steps

    engine = sql.fetch_in_index_order
    if planner_pick:
        sql.fetch_in_index_order = as_planned
    times = []
    try:
        for _ in range(rounds):
            began = time.perf_counter()
            (step,) = claim_due_steps(1, claimed_by="bench")
            times.append(time.perf_counter() - began)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {WorkflowStep._meta.db_table} SET status = 'scheduled', started_at = NULL, "
                    "claimed_by = '', stall_at = NULL WHERE id = %s",
                    [step.pk],
                )
                cursor.execute(f"UPDATE {WorkflowRun._meta.db_table} SET status = 'ready' WHERE id = %s", [step.run_id])
    finally:
        sql.fetch_in_index_order = engine
    return statistics.median(times) * 1000


def measure(gone: int, rounds: int) -> tuple[float, float]:
    """The baseline's and the engine's median ms, ``gone`` steps behind the due one."""
    recreate_database()
    try:
        leave_dead_entries(gone)
        return median_ms(rounds, planner_pick=True), median_ms(rounds, planner_pick=False)
    finally:
        drop_database()


def main() -> None:
    """Print the table (Markdown): ``--gone`` steps behind the due one, then none."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gone", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    head = f"| claim of 1 due step, not vacuumed ({args.rounds} rounds) | PostgreSQL's plan, ms | no bitmap scans, ms"
    print(f"{head} | ratio |")
    print("|---|---:|---:|---:|")
    for gone in (args.gone, 0):
        base, ours = measure(gone, args.rounds)
        print(f"| {gone:,} steps gone before it | {base:.2f} | {ours:.2f} | {ours / base:.2f} |")


if __name__ == "__main__":
    main()
