"""``READ_DATABASE`` on a real streaming replica, started by the test: reads lag, verbs do not.

The test makes a PostgreSQL primary of its own (``initdb``) and a streaming replica of it
(``pg_basebackup -R``), each a server on a free port in a temporary directory, migrates the
primary through ``manage.py migrate``, and runs ``manage.py workflows`` with ``READ_DATABASE``
naming the replica. With the replica's replay paused, a run started on the primary is missing
from the CLI's list while the lag the list shows grows; a verb on that run works (it reads and
writes the primary); once replay resumes the list shows the run, paused. PostgreSQL refuses
to run as root: the servers then run as the ``postgres`` OS user (``runuser``). Both servers
are stopped and their files removed however the test ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from glob import glob
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.procs import ROOT

pytestmark = pytest.mark.processes

#: The newest PostgreSQL server binaries installed (Debian's layout), or None.
BINARIES = max(glob("/usr/lib/postgresql/*/bin"), default=None, key=lambda p: int(Path(p).parent.name))
#: How long a condition may take to hold (a server starting, a replica replaying, a process answering).
PATIENCE = 120.0
DATABASE = "pgbus_replica"


def wait_for(condition: Callable[[], Any], what: str, timeout: float = PATIENCE) -> Any:
    """Poll ``condition`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Cluster:
    """A primary and its streaming replica, as the ``postgres`` OS user when this process is root."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.primary, self.replica = base / "primary", base / "replica"
        self.primary_port, self.replica_port = free_port(), free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.started: list[Path] = []

    def run(self, tool: str, *args: str) -> None:
        """One of the server's programs, which must succeed (its output in the failure)."""
        command = [*self.as_user, f"{BINARIES}/{tool}", *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=PATIENCE, cwd=self.base)
        assert done.returncode == 0, f"{tool} failed: {done.stdout}{done.stderr}"

    def start(self, data: Path, port: int) -> None:
        options = f"-p {port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        self.started.append(data)
        self.run("pg_ctl", "-D", str(data), "-l", str(self.base / f"{data.name}.log"), "-w", "-o", options, "start")

    def up(self) -> None:
        """The primary, a database on it, and the replica streaming from it."""
        self.run("initdb", "-D", str(self.primary), "-U", "root", "--auth=trust", "-E", "UTF8")
        self.start(self.primary, self.primary_port)
        with psycopg.connect(self.url(self.primary_port, "postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        self.run(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(self.primary_port), "-U", "root", "-D", str(self.replica), "-R"),
            *("-X", "stream", "-c", "fast"),
        )
        self.start(self.replica, self.replica_port)

    def stop(self, data: Path) -> None:
        """Stop one server at once (nothing to flush: the test's data is thrown away)."""
        subprocess.run(
            [*self.as_user, f"{BINARIES}/pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=PATIENCE,
            check=False,
        )

    def down(self) -> None:
        for data in reversed(self.started):
            self.stop(data)

    @staticmethod
    def url(port: int, name: str = DATABASE) -> str:
        return f"postgres://root@127.0.0.1:{port}/{name}"

    def on_replica(self, query: str) -> Any:
        """The first value of ``query``'s first row, on the replica."""
        with psycopg.connect(self.url(self.replica_port), autocommit=True) as conn:
            row = conn.execute(query).fetchone()
        return None if row is None else row[0]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    if BINARIES is None or not Path(BINARIES, "pg_basebackup").exists():
        pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin: initdb, pg_ctl, pg_basebackup)")
    base = Path(tempfile.mkdtemp(prefix="pgbus-replica-"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    made = Cluster(base)
    try:
        made.up()
        yield made
    finally:
        made.down()
        shutil.rmtree(base, ignore_errors=True)


def django(
    cluster: Cluster, *args: str, settings: dict[str, Any] | None = None, exits: int = 0, stderr: bool = False
) -> str:
    """``python -m django ARGS`` with ``default`` on the primary and ``replica`` (READ_DATABASE) on the replica.

    Its stdout (``stderr``: its stderr), once it exited with ``exits``.
    """
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": cluster.url(cluster.primary_port),
        "READ_DATABASE_URL": cluster.url(cluster.replica_port),
        "PGBUS_WORKFLOWS_JSON": json.dumps({"READ_DATABASE": "replica", **(settings or {})}),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", *args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == exits, f"{args} exited {done.returncode}: {done.stdout}{done.stderr}"
    return done.stderr if stderr else done.stdout


def start_run(cluster: Cluster) -> str:
    """A run of ``three_steps`` started on the primary (no dispatcher: it stays ready at step one)."""
    code = "from tests.testapp.workflows import ThreeSteps; print(ThreeSteps.start().workflow_id)"
    return django(cluster, "shell", "-c", code).split()[-1]  # after the shell's "objects imported" line


def listed(cluster: Cluster) -> dict[str, str]:
    """``workflows list --json``: run id -> status, as read from the replica."""
    return {row["workflow_id"]: row["status"] for row in json.loads(django(cluster, "workflows", "list", "--json"))}


def lag_shown(cluster: Cluster) -> float:
    """The lag ``workflows list`` prints under its table."""
    footer = django(cluster, "workflows", "list").splitlines()[-1]
    found = re.fullmatch(r"Rows read from 'replica', (?:([\d.]+) s behind|not behind) the primary\.", footer)
    assert found, footer
    return float(found.group(1) or 0)


def test_reads_come_from_the_replica_with_its_lag_and_a_verb_acts_on_the_primary(cluster):
    django(cluster, "migrate", "--database", "default", "-v", "0")
    first = start_run(cluster)
    wait_for(lambda: first in listed(cluster), "the replica to replay the first run")
    assert lag_shown(cluster) == 0  # replayed all it received

    cluster.on_replica("SELECT pg_wal_replay_pause()")
    wait_for(lambda: cluster.on_replica("SELECT pg_get_wal_replay_pause_state()") == "paused", "replay to pause")
    second = start_run(cluster)
    wait_for(
        lambda: cluster.on_replica("SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()"),
        "the replica to receive the second run's WAL",
    )
    assert listed(cluster) == {first: "ready"}  # the replica has not replayed it
    earlier = lag_shown(cluster)
    wait_for(lambda: lag_shown(cluster) > earlier, "the lag shown to grow while replay is paused")
    health = json.loads(django(cluster, "workflows", "health", "--json", settings={"READ_MAX_LAG": 0.001}, exits=1))
    assert health["read_database"]["database"] == "replica" and health["read_database"]["standby"] is True
    assert any(note.startswith("the read database 'replica' is ") for note in health["notes"]), health["notes"]

    # The verb finds the run the replica does not have yet: it reads and writes the primary.
    out = django(cluster, "workflows", "pause", second, "--reason", "replica test")
    assert out.startswith(f"{second}  paused"), out

    cluster.on_replica("SELECT pg_wal_replay_resume()")
    wait_for(lambda: listed(cluster) == {first: "ready", second: "paused"}, "the replica to replay the pause")
    wait_for(lambda: lag_shown(cluster) == 0, "the lag to come back to 0")

    # The replica gone: health notes it (the verdict is the primary's), a list says it in one line.
    cluster.stop(cluster.replica)
    health = json.loads(django(cluster, "workflows", "health", "--json", exits=1))
    assert any(note.startswith("the read database 'replica' cannot be read: ") for note in health["notes"])
    assert health["reasons"] == ["no dispatcher is alive (no dispatcher has registered)"]
    refused = django(cluster, "workflows", "list", exits=1, stderr=True)
    assert refused.startswith("CommandError: Cannot use the database: "), refused
