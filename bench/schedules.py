"""What the schedule leader costs with 10,000 schedules, and that the claim query does not notice them.

    .venv/bin/python -m bench.schedules [--schedules 10000] [--rounds 200]

In a database of its own:

- **ticks/s**: ``--schedules`` hourly schedules, all due at once, fired by the leader's
  service (``services.firing.fire_due``, as the leader calls it), each tick one run; reported
  with ``start()`` of the same workflow as the baseline (a tick is a start, plus the schedule's
  lock and update), so the ratio is what firing adds to a start.
- **idle round**: the leader's round when nothing is due (the due query and the next due time,
  on the partial index ``pgbus_wf_schedule_due``), with no schedules and with ``--schedules``.
- **claim**: a claim of 100 due steps (as ``bench.claims``, rolled back each round), before the
  schedules exist and after, with their runs in the runs table; the ratio should stay near 1.

Ratios, not wall-clock figures, are the result: the machine is shared.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

from bench.claims import LIMIT, insert_due, median_ms, new_claim
from bench.common import drop_database, recreate_database

WORKFLOW = "noop1"
HOUR = timedelta(hours=1)


def insert_schedules(count: int) -> None:
    """``count`` hourly schedules of :data:`WORKFLOW`, all due now: their tick is this hour's (one statement)."""
    from django.db import connection

    from pgbus_workflows.dsl.schedules import latest_tick
    from pgbus_workflows.models import WorkflowSchedule
    from pgbus_workflows.sql import clock

    due = latest_tick("", HOUR, "UTC", clock.now())
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {WorkflowSchedule._meta.db_table} (name, workflow_class, cron, every, timezone, arguments,
                overlap, catchup, enabled, declared, paused, next_fire_at, due_at, created_at, updated_at)
            SELECT 'bench ' || n, %s, '', interval '1 hour', 'UTC', '{{}}'::jsonb, 'allow', 'latest', true, false,
                   false, %s, %s, now(), now()
            FROM generate_series(1, %s) AS n
            """,
            [WORKFLOW, due, due, count],
        )
        cursor.execute(f"ANALYZE {WorkflowSchedule._meta.db_table}")


def fire_all(count: int) -> tuple[float, int]:
    """Seconds to fire every due tick, and how many runs started (each schedule's one tick)."""
    from pgbus_workflows.services.firing import fire_due
    from pgbus_workflows.sql import clock

    now = clock.now()
    began = time.perf_counter()
    started = 0
    while started < count:
        fired = fire_due(now)
        if not fired:
            break
        started += len(fired)
    return time.perf_counter() - began, started


def start_all(count: int) -> float:
    """Seconds to ``start()`` ``count`` runs of :data:`WORKFLOW` one by one (the baseline)."""
    from pgbus_workflows.dsl.declared import registry

    cls = registry.class_for(WORKFLOW)
    began = time.perf_counter()
    for _ in range(count):
        cls.start()
    return time.perf_counter() - began


def median_round_ms(rounds: int) -> float:
    """Median milliseconds of an idle leader round: nothing due, then when the next tick is."""
    from pgbus_workflows.services.firing import fire_due, next_due_at

    def one() -> None:
        assert fire_due() == []
        next_due_at()

    return _median_ms(one, rounds)


def _median_ms(work: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def measure(schedules: int, rounds: int) -> dict[str, float]:
    """Every figure of the table, by name."""
    recreate_database()
    from pgbus_workflows.models import WorkflowRun  # Django is set up on the bench database now

    insert_due(5_000, "noop3", "a", 0)
    figures = {"start() per second": schedules / start_all(schedules)}
    figures["idle round, no schedules (ms)"] = median_round_ms(rounds)
    figures["claim before (ms)"] = median_ms(new_claim, rounds)
    insert_schedules(schedules)
    seconds, fired = fire_all(schedules)
    if fired != schedules or WorkflowRun.objects.filter(schedule__isnull=False).count() != schedules:
        raise AssertionError(f"{fired} ticks fired for {schedules} due schedules")
    figures["ticks fired per second"] = fired / seconds
    finish_scheduled_runs()
    figures["idle round, with the schedules (ms)"] = median_round_ms(rounds)
    figures["claim after (ms)"] = median_ms(new_claim, rounds)
    drop_database()
    return figures


def finish_scheduled_runs() -> None:
    """End the runs the ticks started (history, as they would be by the next tick), and vacuum.

    The claim then sees the same due steps as before the schedules: only the schedules' rows
    and their finished runs are new.
    """
    from django.db import connection

    from pgbus_workflows.models import WorkflowRun, WorkflowStep

    runs, steps = WorkflowRun._meta.db_table, WorkflowStep._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {steps} SET status = 'completed', outcome = 'success' "
            f"WHERE run_id IN (SELECT id FROM {runs} WHERE schedule_id IS NOT NULL)"
        )
        cursor.execute(f"UPDATE {runs} SET status = 'finished' WHERE schedule_id IS NOT NULL")
        cursor.execute(f"VACUUM ANALYZE {steps}")
        cursor.execute(f"VACUUM ANALYZE {runs}")


def main() -> None:
    """Print the table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    f = measure(args.schedules, args.rounds)
    idle = f["idle round, with the schedules (ms)"]
    print(f"| the schedule leader, {args.schedules:,} schedules | figure | ratio |")
    print("|---|---:|---:|")
    print(
        f"| ticks fired per second (vs `start()` per second) | {f['ticks fired per second']:.0f} | "
        f"{f['ticks fired per second'] / f['start() per second']:.2f} |"
    )
    print(f"| idle leader round, ms (vs no schedules) | {idle:.2f} | {idle / f['idle round, no schedules (ms)']:.2f} |")
    print(
        f"| claim of {LIMIT} steps, ms (vs before the schedules) | {f['claim after (ms)']:.2f} | "
        f"{f['claim after (ms)'] / f['claim before (ms)']:.2f} |"
    )


if __name__ == "__main__":
    main()
