"""Retention soak: runs started, finished and deleted for minutes on end; the tables' sizes stay flat.

    .venv/bin/python -m bench.retention_soak [--minutes 10] [--rate 20] [--retention 60]

In a database of its own: one dispatcher (concurrency 4) with its sweep every 10 s and
``RETENTION`` of ``--retention`` seconds; this process starts ``NoOp3`` runs at ``--rate`` a
second, one transaction each, as web requests would. The sweep deletes expired runs hourly
(and at every sweep while a backlog is left): so that a soak of minutes sees many cycles,
this process runs that cleanup phase (``delete_expired_runs``, ten batches) every 10 s.
Once a steady state can have come (three retentions, and ten minutes), the size of the
app's tables with their indexes and TOAST (``pg_total_relation_size``) is read every 30 s;
the goal (issue #53) is that it grows by no more than 20 % from the first of those readings
to the largest. Autovacuum is off on this
project's benchmark server, so the soak vacuums the app's tables every minute, as
autovacuum's launcher would (``autovacuum_naptime`` is one minute by default); a server with
autovacuum on needs nothing of the kind. Vacuum removes no row that a transaction still open
anywhere on the server might see, so each reading also gives the age of the server's oldest
snapshot, in transactions: a long one (a bulk load, a forgotten ``BEGIN``) lets the tables
grow until it ends. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.common import ROOT, drop_database, recreate_database, stop, wait_registered

#: Seconds between two readings of the sizes, two vacuums, and two cleanups.
READ_EVERY, VACUUM_EVERY, CLEANUP_EVERY = 30.0, 60.0, 10.0
#: The goal: growth from the first steady reading to the largest.
GROWTH_GOAL = 0.20


def warm_up(retention: float) -> float:
    """Seconds before the first reading: three retentions, and ten minutes.

    Ten minutes: the indexes' emptied pages are reused only once a vacuum has recycled them
    after another; at 20 runs/s on the project's machine the sizes stopped growing after 8 to
    13 minutes (``bench.retention_soak`` with a shorter warm-up shows the climb).
    """
    return max(3 * retention, 600.0)


def app_tables() -> list[str]:
    """The tables of the app's models."""
    from django.apps import apps

    return [model._meta.db_table for model in apps.get_app_config("pgbus_workflows").get_models()]


def total_size(tables: list[str]) -> int:
    """Bytes of ``tables`` with their indexes and TOAST."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%s::text[]) AS t", [tables])
        return int(cursor.fetchone()[0])


def relation_sizes(tables: list[str]) -> dict[str, int]:
    """Bytes of each of ``tables`` (heap and TOAST) and of each of their indexes, by name."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, pg_table_size(c.oid) FROM pg_class c WHERE c.relname = ANY(%s)
            UNION ALL
            SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
            FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relname = ANY(%s)
            """,
            [tables, tables],
        )
        return dict(cursor.fetchall())


def horizon_age() -> int:
    """How many transactions old the server's oldest snapshot is: vacuum keeps every row it may see."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(max(age(backend_xmin)), 0) FROM pg_stat_activity WHERE pid <> pg_backend_pid()")
        return int(cursor.fetchone()[0])


def vacuum(tables: list[str]) -> None:
    """A plain VACUUM of each table, as autovacuum would run (autocommit: VACUUM takes no transaction)."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"VACUUM {table}")


def soak_settings(retention: float) -> None:
    """``RETENTION`` of ``retention`` seconds and a sweep every 10 s, here and in the dispatcher.

    Set before Django's setup, which reads them.
    """
    os.environ["PGBUS_WORKFLOWS_JSON"] = json.dumps({"RETENTION": retention, "SWEEP_INTERVAL": 10})


def dispatcher() -> subprocess.Popen[bytes]:
    """One dispatcher with the soak's settings."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "django", "run_workflow_dispatcher", "--concurrency", "4", "-v", "0"]
    return subprocess.Popen(command, cwd=ROOT, env=env)


def soak(
    minutes: float, rate: float, retention: float
) -> tuple[list[tuple[float, int, int]], dict[str, tuple[int, int]]]:
    """(seconds since the steady state could begin, bytes, runs in the tables) at each reading,
    and each relation's bytes at the first reading and the last."""
    from pgbus_workflows.models import WorkflowRun
    from pgbus_workflows.services.retention import delete_expired_runs
    from pgbus_workflows.sql import clock
    from tests.testapp.workflows import NoOp3

    tables = app_tables()
    process = dispatcher()
    readings: list[tuple[float, int, int, int]] = []
    try:
        wait_registered(1)
        began = time.monotonic()
        steady = began + warm_up(retention)
        end = steady + minutes * 60
        next_read, next_vacuum, next_cleanup, started = steady, began + VACUUM_EVERY, began, 0
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        while (now := time.monotonic()) < end:
            if started < (now - began) * rate:
                NoOp3.start()
                started += 1
                continue
            if now >= next_cleanup:
                delete_expired_runs(clock.now(), max_batches=10)
                next_cleanup += CLEANUP_EVERY
            if now >= next_vacuum:
                vacuum(tables)
                next_vacuum += VACUUM_EVERY
            if now >= next_read:
                runs = WorkflowRun.objects.count()
                readings.append((now - steady, total_size(tables), runs, horizon_age()))
                last = relation_sizes(tables)
                first = first or last
                next_read += READ_EVERY
            time.sleep(min(1 / rate, 0.05))
    finally:
        stop([process])
    return readings, {name: (first[name], last[name]) for name in first}


def main() -> None:
    """Soak and print the readings (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="of readings, after three retentions")
    parser.add_argument("--rate", type=float, default=20.0, help="runs started a second")
    parser.add_argument("--retention", type=float, default=60.0, help="RETENTION, seconds")
    args = parser.parse_args()
    soak_settings(args.retention)
    recreate_database()
    try:
        readings, relations = soak(args.minutes, args.rate, args.retention)
    finally:
        drop_database()
    first, largest = readings[0][1], max(reading[1] for reading in readings)
    growth = largest / first - 1
    warm = warm_up(args.retention)
    print(f"{args.rate:g} runs/s for {args.minutes:g} min after {warm:.0f} s, RETENTION {args.retention:g} s")
    print()
    print("| seconds | MB, tables with indexes | runs in the table | oldest snapshot, transactions old |")
    print("|---:|---:|---:|---:|")
    for seconds, size, runs, horizon in readings:
        print(f"| {seconds:.0f} | {size / 1e6:.1f} | {runs:,} | {horizon:,} |")
    verdict = "yes" if growth <= GROWTH_GOAL else "no"
    print()
    print(f"Growth from the first reading to the largest: {growth:.0%} (goal <= {GROWTH_GOAL:.0%}: {verdict}).")
    print()
    print("| relation (the ten that grew most) | first reading, kB | last, kB |")
    print("|---|---:|---:|")
    grown = sorted(relations.items(), key=lambda item: item[1][0] - item[1][1])[:10]
    for name, (before, after) in grown:
        print(f"| {name} | {before / 1e3:.0f} | {after / 1e3:.0f} |")


if __name__ == "__main__":
    main()
