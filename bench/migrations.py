"""What each migration locks, and for how long, on a database with 1,000,000 runs.

    .venv/bin/python -m bench.migrations [--runs 1000000]

Migrates a database of its own to 0001, loads ``--runs`` finished runs with a step and an event
each, then applies every later migration one at a time while another connection writes a run
row every 10 ms (as the application would) and a third samples ``pg_locks`` every 5 ms. For
each migration it prints its duration, the strongest lock it took on each table of the app, and
the longest a concurrent write waited. Before 0004 the partial unique index
``pgbus_wf_one_active_step_per_run`` is dropped, as the first 0002 dropped it on every install,
so that 0004 has it to rebuild. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common import recreate_database

#: Lock modes, weakest first (PostgreSQL's table-level locks).
MODES = [
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
]
#: Every migration after 0001, in order (read from the app's migrations folder).
LATER = sorted(
    path.stem
    for path in (Path(__file__).resolve().parent.parent / "pgbus_workflows" / "migrations").glob("0*.py")
    if not path.stem.startswith("0001")
)


def load(runs: int) -> None:
    """``runs`` finished runs, a completed step and an event each, in a few statements."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgbus_workflows_workflowrun (workflow_id, workflow_class, status, current_step, "
            "subject_type, subject_id, arguments, idempotency_key, allow_multiple, created_at, started_at, "
            "finished_at, status_changed_at, paused_reason, rerun_of) "
            "SELECT gen_random_uuid(), 'history', 'finished', 'only', NULL, NULL, '{}', NULL, false, now(), now(), "
            "now(), now(), '', NULL FROM generate_series(1, %s)",
            [runs],
        )
        cursor.execute(
            "INSERT INTO pgbus_workflows_workflowstep (run_id, step_name, attempt, status, outcome, reattempt_reason, "
            "queue, priority, scheduled_at, created_at, started_at, finished_at, stall_at, claimed_by, output, "
            "error_class, error_message, traceback, wait_for, waiting_since, timeout_at, timed_out, signal_id, "
            "fan_out_total, timeout) SELECT id, 'only', 1, 'completed', 'success', '', 'workflows', 0, now(), now(), "
            "now(), now(), NULL, 'bench', NULL, '', '', '', NULL, NULL, NULL, false, NULL, NULL, NULL "
            "FROM pgbus_workflows_workflowrun"
        )
        cursor.execute(
            "INSERT INTO pgbus_workflows_workflowevent (run_id, step_id, kind, transition, from_status, to_status, "
            "actor, reason, details, created_at) SELECT run_id, id, 'finished', 'finish', 'performing', 'finished', "
            "'system', '', '{}', now() FROM pgbus_workflows_workflowstep"
        )
        cursor.execute("ANALYZE")


class Probe:
    """A writer (one run row every 10 ms: its longest wait) and a sampler of the migration's locks."""

    def __init__(self, migrating_pid: int) -> None:
        self.pid = migrating_pid
        self.stop = threading.Event()
        self.longest_write = 0.0
        self.strongest: dict[str, str] = {}
        self.held: dict[tuple[str, str], float] = defaultdict(float)
        self._threads = [threading.Thread(target=self._write), threading.Thread(target=self._sample)]

    def __enter__(self) -> Probe:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join()

    def _connect(self) -> Any:
        import psycopg

        from pgbus_workflows.sql.session import connection_params

        return psycopg.connect(**connection_params(), autocommit=True)

    def _write(self) -> None:
        with self._connect() as conn:
            conn.execute("SET lock_timeout = '60s'")
            while not self.stop.wait(0.01):
                began = time.monotonic()
                conn.execute("UPDATE pgbus_workflows_workflowrun SET paused_reason = '' WHERE id = 1")
                self.longest_write = max(self.longest_write, time.monotonic() - began)

    def _sample(self) -> None:
        with self._connect() as conn:
            last = time.monotonic()
            while not self.stop.wait(0.005):
                rows = conn.execute(
                    "SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                    "WHERE l.pid = %s AND l.granted AND c.relname LIKE 'pgbus_workflows_%%' AND c.relkind = 'r'",
                    [self.pid],
                ).fetchall()
                now = time.monotonic()
                for table, mode in rows:
                    if MODES.index(mode) > MODES.index(self.strongest.get(table, MODES[0])):
                        self.strongest[table] = mode
                    self.held[(table, mode)] += now - last
                last = now


def main() -> None:
    """Load, migrate one by one, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    args = parser.parse_args()
    recreate_database()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", "pgbus_workflows", "0001", verbosity=0)
    began = time.monotonic()
    load(args.runs)
    print(f"loaded {args.runs:,} runs, steps and events in {time.monotonic() - began:.0f} s\n")
    print(
        "| migration | seconds | strongest lock per table (time held at ShareLock or above) | longest write wait (ms) |"
    )
    print("|---|---|---|---|")
    for name in LATER:
        if name.startswith("0004"):
            with connection.cursor() as cursor:
                cursor.execute("DROP INDEX IF EXISTS pgbus_wf_one_active_step_per_run")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with Probe(pid) as probe:
            began = time.monotonic()
            call_command("migrate", "pgbus_workflows", name, verbosity=0)
            seconds = time.monotonic() - began
        locks = []
        for table, mode in sorted(probe.strongest.items()):
            strong = sum(
                t for (tb, m), t in probe.held.items() if tb == table and MODES.index(m) >= MODES.index("ShareLock")
            )
            locks.append(f"{table.removeprefix('pgbus_workflows_')}: {mode}" + (f" ({strong:.2f} s)" if strong else ""))
        print(f"| {name} | {seconds:.1f} | {'; '.join(locks) or 'none sampled'} | {probe.longest_write * 1000:.0f} |")


if __name__ == "__main__":
    main()
