"""What each operation costs the primary, counted: round trips, statements, commits, WAL bytes, server CPU.

    python -m bench.capacity [--runs N]

(:func:`counted` alone touches no environment: a test imports it without the bench database.)

Each operation runs ``N`` times on the bench database made anew, one at a time on one
connection, as a web request or a dispatcher's worker in a trickle does it:

- ``start``: ``NoOp3.start()``, each its own transaction;
- ``step``: a step of a three-step run, as a worker runs it (a claim, the body, the outcome's
  transaction, which claims the run's next step: ``bench.instructions.steps_one_at_a_time``),
  with the engine's statements prepared on the connection, as a dispatcher's are;
- ``signal``: ``wf.signal()`` to a run waiting for it (the delivery alone; the step it wakes
  is a step);
- ``fan-out job``: a job of a fan-out, claimed and run alone (``claim_due_jobs(1)``, its
  function, its end, the fan-out's resolution after the last);
- ``task enqueue`` and ``task run``: ``add.enqueue()`` of Django's task API on the workflows
  backend, and its run as a worker runs it.

Counted, so the same from run to run whatever the machine does: round trips (libpq's trace:
each wait for the server), statements (Django's execute wrapper, pipelined ones too), and from
the write-ahead log (``pg_walinspect``: the records of the bench database's blocks and of the
transactions that wrote them, so other databases' writes do not count) the commits that wrote
something (each a flush of the log, unless ``synchronous_commit`` is off for it) and the WAL
bytes of their records, without the full-page images that the first change of each page after
a checkpoint adds (how many depends on when the checkpoint came, not on the code). Measured:
the server's CPU time (its backend's ``/proc/<pid>/stat``, so the server must run on this
machine), the one figure that moves with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

DEFAULT_RUNS = 300
#: The replication slot that keeps the measured WAL until it is read.
SLOT = "pgbus_bench_capacity"
_DATABASE = re.compile(r"rel \d+/(\d+)/\d+")


@dataclass(frozen=True)
class Cost:
    """What ``count`` operations cost, in total."""

    count: int
    round_trips: int
    statements: int
    commits: int
    wal_bytes: int
    server_cpu_seconds: float

    def per(self) -> dict[str, float]:
        """Each figure per operation."""
        return {
            "round trips": self.round_trips / self.count,
            "statements": self.statements / self.count,
            "commits": self.commits / self.count,
            "WAL bytes": self.wal_bytes / self.count,
            "server CPU µs": self.server_cpu_seconds * 1e6 / self.count,
        }


def _cursor_value(sql: str, params: list[Any] | None = None) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def _server_cpu() -> float:
    """This connection's backend's user + system CPU seconds, from /proc (the server on this machine)."""
    pid = _cursor_value("SELECT pg_backend_pid()")
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wal(start: str, end: str) -> tuple[int, int]:
    """``(commits, bytes)`` of the WAL between two positions written for the bench database.

    Its records are those of its blocks and every record of the transactions that wrote them
    (their commits among them); a commit is a ``Transaction`` record of type ``COMMIT``.
    """
    from django.db import connection

    if start == end:  # nothing was written, here or anywhere
        return 0, 0
    oid = _cursor_value("SELECT oid FROM pg_database WHERE datname = current_database()")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xid, block_ref, resource_manager, record_type, record_length - fpi_length "
            "FROM pg_get_wal_records_info(%s, %s)",
            [start, end],
        )
        records = cursor.fetchall()

    def of_database(ref: str | None) -> bool:
        found = _DATABASE.search(ref or "")
        return found is not None and int(found.group(1)) == oid

    writers = {xid for xid, ref, *_ in records if xid and of_database(ref)}
    ours = [(manager, kind, size) for xid, ref, manager, kind, size in records if xid in writers or of_database(ref)]
    commits = sum(1 for manager, kind, _ in ours if manager == "Transaction" and kind.startswith("COMMIT"))
    return commits, sum(size for *_, size in ours)


@contextmanager
def counted(count: int) -> Iterator[Callable[[], Cost]]:
    """Count what the block costs; call the yielded function after it for the :class:`Cost` of ``count`` operations.

    Needs a superuser (or the roles that read the WAL and make replication slots) and the
    server on this machine (its CPU is read from /proc).
    """
    import psycopg
    from django.db import connection

    statements: list[str] = []

    def record(execute: Any, text: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(text)
        return execute(text, params, many, context)

    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    # A slot of its own keeps the WAL written meanwhile until it is read (checkpoints would
    # recycle it, sooner when other databases write too).
    slot = f"{SLOT}_{os.getpid()}"
    _cursor_value("SELECT pg_create_physical_replication_slot(%s, true)::text", [slot])
    result: list[Cost] = []
    try:
        cpu = _server_cpu()
        wal_from = _cursor_value("SELECT pg_current_wal_insert_lsn()::text")
        pgconn = connection.connection.pgconn
        with tempfile.TemporaryFile("w+") as trace:
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
            try:
                with connection.execute_wrapper(record):
                    yield lambda: result[0]
            finally:
                pgconn.untrace()
            trace.seek(0)
            trips = sum("\tReadyForQuery" in line for line in trace if line.startswith("B"))
        cpu_used = _server_cpu() - cpu
        wal_to = _cursor_value("SELECT pg_current_wal_insert_lsn()::text")
        _cursor_value("SELECT pg_switch_wal()::text")  # what was inserted is flushed and readable
        commits, wal_bytes = _wal(wal_from, wal_to)
        result.append(Cost(count, trips, len(statements), commits, wal_bytes, cpu_used))
    finally:
        _cursor_value("SELECT pg_drop_replication_slot(%s)::text", [slot])


def measure(runs: int) -> dict[str, dict[str, float]]:
    """Every operation's cost per operation, on the bench database made anew (dropped after).

    A web request's calls (a start, a signal, a task's enqueue) run as Django leaves a
    connection, planning each statement; a dispatcher's work (a step, a job, a task's run) with
    the engine's statements prepared, as a dispatcher's connections have them.
    """
    from bench.common import drop_database, recreate_database  # it points DATABASE_URL at the bench's
    from bench.instructions import steps_one_at_a_time

    recreate_database()
    try:
        from tests.testapp.tasks import add
        from tests.testapp.workflows import Approval, FanBench, NoOp3

        costs = {}
        NoOp3.start()  # the process's first start reads the server's clock and looks its function up
        with counted(runs) as cost:
            for _ in range(runs):
                NoOp3.start()
        costs["start"] = cost()
        with dispatching(), counted(3 * (runs + 1)) as cost:
            steps_one_at_a_time()
        costs["step"] = cost()
        waiting = [Approval.start() for _ in range(runs)]
        with dispatching():
            steps_one_at_a_time()  # each run parks on its signal wait
        with counted(runs) as cost:
            for wf in waiting:
                wf.signal("approved", {"ok": True})
        costs["signal"] = cost()
        with dispatching():
            steps_one_at_a_time()
            costs["fan-out job"] = _jobs(FanBench, runs)
        with counted(runs) as cost:
            for n in range(runs):
                add.enqueue(n, 1)
        costs["task enqueue"] = cost()
        with dispatching(), counted(runs) as cost:
            steps_one_at_a_time()
        costs["task run"] = cost()
    finally:
        drop_database()
    return {name: found.per() for name, found in costs.items()}


@contextmanager
def dispatching() -> Iterator[None]:
    """The engine's statements prepared on this process's connections, as a dispatcher's are, for the block."""
    from django.db import connection

    from pgbus_workflows import sql

    saved = set(sql._prepared_at)
    sql.prepare_statements(connection.connection)
    try:
        yield
    finally:
        sql._prepared_at.clear()
        sql._prepared_at.update(saved)
        sql._preparing.clear()


def _jobs(fan_out: Any, runs: int) -> Cost:
    """The cost of ``runs`` jobs of one fan-out, each claimed and run alone as a worker does."""
    from bench.instructions import steps_one_at_a_time
    from pgbus_workflows.services.chain import Chain
    from pgbus_workflows.services.fanout import claim_due_jobs, execute_job

    fan_out.start(count=runs)
    steps_one_at_a_time()  # the fan-out step makes its jobs and parks
    chain = Chain("bench")
    with counted(runs) as cost:
        while jobs := claim_due_jobs(1, None, "bench"):
            execute_job(jobs[0], chain=chain)
    steps_one_at_a_time()  # the step after the fan-out
    return cost()


def print_table(per: dict[str, dict[str, float]]) -> None:
    """The Markdown table of the capacity page."""
    columns = ["round trips", "statements", "commits", "WAL bytes", "server CPU µs"]
    print(f"| per operation | {' | '.join(columns)} |")
    print(f"|---|{'---:|' * len(columns)}")
    for name, figures in per.items():
        cells = [f"{figures[c]:,.0f}" if c in ("WAL bytes", "server CPU µs") else f"{figures[c]:.2f}" for c in columns]
        print(f"| {name} | {' | '.join(cells)} |")


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    print_table(measure(parser.parse_args().runs))


if __name__ == "__main__":
    main()
