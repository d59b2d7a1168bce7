"""What the database writes per run: WAL records and bytes, and the index entries among them, by index.

    python -m bench.wal [--runs N]

Each index entry a write adds is a WAL record and work for the server, on every row version
(an update that changes an indexed column, as every claim and outcome does, is never HOT).
Counted with ``pg_walinspect`` (PostgreSQL 15+) over two stretches of WAL on the bench database
made anew: ``N`` ``NoOp3.start()`` calls, then their three steps each run as a dispatcher's
worker runs them in a trickle (``bench.instructions.steps_one_at_a_time``), one at a
time. The counts are the same from run to run, whatever the machine's speed,
as long as nothing else writes to the server meanwhile (its WAL is one for every database):
run it on a quiet server.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from typing import Any

from bench.common import recreate_database
from bench.instructions import steps_one_at_a_time

DEFAULT_RUNS = 300
_RELATION = re.compile(r"rel \d+/\d+/(\d+)")


def flushed(cursor: Any) -> str:
    """The WAL position flushed so far (what ``pg_walinspect`` may read up to)."""
    cursor.execute("SELECT pg_current_wal_flush_lsn()")
    return cursor.fetchone()[0]


def totals(cursor: Any, start: str, end: str) -> list[tuple[str, int, int]]:
    """``(resource manager, records, bytes)`` of the WAL between two positions, the largest first."""
    cursor.execute(
        'SELECT "resource_manager/record_type", count, record_size + fpi_size FROM pg_get_wal_stats(%s, %s, false) '
        "WHERE count > 0 ORDER BY record_size DESC",
        [start, end],
    )
    return cursor.fetchall()


def index_entries(cursor: Any, start: str, end: str) -> Counter[str]:
    """B-tree WAL records between two positions, by index name."""
    cursor.execute(
        "SELECT block_ref FROM pg_get_wal_records_info(%s, %s) WHERE resource_manager = 'Btree'", [start, end]
    )
    nodes = Counter(int(m.group(1)) for (ref,) in cursor.fetchall() if (m := _RELATION.search(ref or "")))
    cursor.execute("SELECT relfilenode, relname FROM pg_class WHERE relfilenode = ANY(%s)", [list(nodes)])
    names = dict(cursor.fetchall())
    return Counter({names.get(node, str(node)): count for node, count in nodes.items()})


def main() -> None:
    """Start the runs, run their steps, print per run what each stretch wrote."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    runs = parser.parse_args().runs
    recreate_database()
    from django.db import connection

    from tests.testapp.workflows import NoOp3

    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cursor.execute("CHECKPOINT")  # full-page images come after a checkpoint: one now, not during
        before = flushed(cursor)
    for _ in range(runs):
        NoOp3.start()
    with connection.cursor() as cursor:
        started = flushed(cursor)
    steps_one_at_a_time()
    with connection.cursor() as cursor:
        ended = flushed(cursor)
        stretches = [("`start()`", before, started), ("its three steps", started, ended)]
        print(f"| per run ({runs:,} NoOp3 runs) | WAL records | WAL bytes | of which index entries (B-tree records) |")
        print("|---|---:|---:|---:|")
        for label, start, end in stretches:
            found = totals(cursor, start, end)
            btree = sum(count for manager, count, _ in found if manager == "Btree")
            records, size = sum(count for _, count, _ in found), sum(size for _, _, size in found)
            print(f"| {label} | {records / runs:.1f} | {size / runs:,.0f} | {btree / runs:.1f} |")
        print()
        print("| index entries per run, by index (the three steps) | entries |")
        print("|---|---:|")
        for name, count in index_entries(cursor, started, ended).most_common():
            print(f"| `{name}` | {count / runs:.1f} |")


if __name__ == "__main__":
    main()
