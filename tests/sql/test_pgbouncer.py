"""Behind PgBouncer in transaction mode (a real PgBouncer, Debian's): the sweep lock and LISTEN.

Consecutive transactions of one client may run on different server connections there: a
session-level advisory lock can stay behind on a pooled server connection (nobody sweeps
again), and a LISTEN is left on a server connection the client no longer holds.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pgbus_workflows.dispatcher.sweep import SWEEP_LOCK_KEY
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.sql.session import TransactionLock, connection_params, probe_listen
from tests.procs import DispatcherProcess, eventually
from tests.testapp.workflows import NoOp3

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not Path(PGBOUNCER).exists() and not os.environ.get("CI"),  # CI installs it: there, its absence fails
        reason="needs Debian's pgbouncer (apt-get install pgbouncer; .ci/run does)",
    ),
]

INI = """
[databases]
* = host={host} port={port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
auth_type = trust
auth_file = {dir}/users.txt
pool_mode = transaction
unix_socket_dir =
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
default_pool_size = 4
ignore_startup_parameters = extra_float_digits,options
"""


@pytest.fixture
def pgbouncer():
    """A PgBouncer in transaction mode in front of the test PostgreSQL; this thread's connection goes through it."""
    settings_dict = connection.settings_dict
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    listen = free_port()
    (folder / "users.txt").write_text(f'"{settings_dict["USER"]}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        INI.format(
            host=settings_dict["HOST"] or "127.0.0.1", port=settings_dict["PORT"] or 5432, listen=listen, dir=folder
        )
    )
    folder.chmod(0o777)
    for path in folder.iterdir():
        path.chmod(0o666)
    user = ["-u", "postgres"] if os.geteuid() == 0 else []  # it refuses to run as root
    process = subprocess.Popen([PGBOUNCER, *user, str(folder / "pgbouncer.ini")])
    deadline = time.monotonic() + 10
    while True:
        try:
            psycopg.connect(**{**connection_params(), "port": listen}).close()
            break
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, (folder / "pgbouncer.log").read_text()
            time.sleep(0.1)
    saved = settings_dict["PORT"], settings_dict["OPTIONS"]
    connection.close()
    settings_dict.update(PORT=str(listen), OPTIONS={**saved[1], "sslmode": "disable"})
    yield listen
    connection.close()
    settings_dict.update(PORT=saved[0], OPTIONS=saved[1])
    process.send_signal(signal.SIGINT)
    process.wait(timeout=10)
    shutil.rmtree(folder, ignore_errors=True)


def free_port() -> int:
    """A free loopback port (closed again before PgBouncer takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_listen_behind_a_transaction_pool_is_detected_and_direct_listen_is_not(pgbouncer):
    with (
        psycopg.connect(**connection_params(), autocommit=True) as pooled,
        psycopg.connect(**connection_params()) as busy,
    ):
        pooled.execute("LISTEN probe_channel")
        # Another client's transaction now holds the server connection the LISTEN ran on (the
        # only idle one), as happens under load: the probe goes out on another one.
        busy.execute("SELECT 1")
        assert not probe_listen(pooled, "probe_channel")
    direct = {**connection_params(), "port": 5432}
    with psycopg.connect(**direct, autocommit=True) as conn:
        conn.execute("LISTEN probe_channel")
        assert probe_listen(conn, "probe_channel")


def test_the_sweep_lock_excludes_a_second_sweeper_behind_the_pool_and_is_released(pgbouncer):
    first, second = TransactionLock(SWEEP_LOCK_KEY), TransactionLock(SWEEP_LOCK_KEY)
    assert first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


HOLDER = """
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1])
assert conn.execute("SELECT pg_try_advisory_xact_lock(%s)", [int(sys.argv[2])]).fetchone()[0]
print("held", flush=True)
time.sleep(60)
"""


def test_a_sweeper_killed_while_holding_the_lock_behind_the_pool_leaves_no_lock(pgbouncer):
    params = connection_params()
    dsn = psycopg.conninfo.make_conninfo(**params)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, dsn, str(SWEEP_LOCK_KEY)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not TransactionLock(SWEEP_LOCK_KEY).acquire()
        holder.kill()
        holder.wait(timeout=10)
        lock = TransactionLock(SWEEP_LOCK_KEY)
        deadline = time.monotonic() + 10
        while not lock.acquire():
            assert time.monotonic() < deadline, "the lock of a killed sweeper stayed behind in the pool"
            time.sleep(0.1)
        lock.release()
    finally:
        holder.kill()


def test_a_dispatcher_told_not_to_prepare_runs_every_step_behind_the_pool(pgbouncer):
    # Its LISTEN check may pass through an idle pool; PREPARED_STATEMENTS=False keeps every
    # statement unprepared, as a statement prepared on one pooled server connection would be
    # missing on the next, and the claims and outcomes would fail.
    settings = {"POLL_INTERVAL": 0.2, "PREPARED_STATEMENTS": False}
    process = DispatcherProcess("--no-sweep", "--concurrency", "2", settings=settings)
    try:
        eventually(lambda: "started" in process.output(), what="the dispatcher to start")
        time.sleep(2)  # past its LISTEN check
        runs = [NoOp3.start() for _ in range(10)]
        eventually(lambda: all(wf.reload().status == "finished" for wf in runs), timeout=60, what="the runs to finish")
        output = process.output()
    finally:
        process.stop()
    assert "Traceback" not in output and "prepared statement" not in output


def test_web_threads_call_start_s_function_behind_the_pool(pgbouncer):
    """start()'s function keeps nothing on the client: threads whose transactions hop between four
    pooled server connections call it (each server session compiles it once) and every run is written."""
    from pgbus_workflows.sql import functions

    started: list = []
    errors: list = []

    def web_thread() -> None:
        try:
            for _ in range(functions.THRESHOLD + 15):
                started.append(NoOp3.start().record.pk)
        except Exception as error:
            errors.append(error)
        finally:
            connection.close()

    with CaptureQueriesContext(connection) as queries:
        web_thread()  # this thread's own: its calls are seen
    threads = [threading.Thread(target=web_thread) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    calls = [q for q in queries.captured_queries if q["sql"].startswith(f"SELECT * FROM public.{functions.PREFIX}")]
    assert len(calls) == 15
    assert WorkflowStep.objects.filter(run_id__in=started, status="scheduled").count() == len(started) == 7 * 20
