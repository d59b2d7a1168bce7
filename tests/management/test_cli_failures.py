"""``manage.py workflows`` (and the dispatcher) when they cannot work: the database down, a reason too long.

One line, never a traceback.
"""

import os
import socket
import subprocess
import sys

import pytest

from pgbus_workflows.admin.forms import MAX_REASON_LENGTH
from pgbus_workflows.models import WorkflowEvent
from tests.management.test_cli import cli, refusal, wid
from tests.management.test_cli_processes import finish, manage
from tests.procs import ROOT
from tests.testapp.workflows import ThreeSteps

pytestmark = pytest.mark.processes

ANY_ID = "0123456789abcdef0123456789abcdef"

SUBCOMMANDS = [
    ("list",),
    ("list", "--json"),
    ("show", ANY_ID),
    ("pause", ANY_ID),
    ("resume", "--at", "one", ANY_ID),
    ("cancel", ANY_ID, "--as-user", "alice"),
    ("rerun", ANY_ID),
    ("run-now", ANY_ID),
    ("skip", ANY_ID),
    ("signal", "go", ANY_ID),
    ("schedules", "list"),
    ("schedules", "pause", "1"),
    ("schedules", "fire-now", "nightly_report:daily"),
]


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("args", SUBCOMMANDS, ids=" ".join)
def test_every_subcommand_says_in_one_line_that_the_database_is_unreachable(args):
    url = f"postgres://nobody@127.0.0.1:{closed_port()}/nothing"
    code, out, err = finish(manage(*args, url=url))
    assert code == 1
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("CommandError: Cannot use the database: connection failed:"), err
    assert "Traceback" not in err


@pytest.mark.django_db
def test_a_reason_longer_than_the_admin_allows_is_refused_and_nothing_happens():
    wf = ThreeSteps.start()
    message = refusal("pause", wid(wf), "--reason", "x" * (MAX_REASON_LENGTH + 1))
    assert message == "Error: argument --reason: at most 2000 characters (as in the admin), got 2001"
    assert wf.reload().status == "ready"
    assert not WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="paused").exists()
    cli("pause", wid(wf), "--reason", "x" * MAX_REASON_LENGTH)
    assert wf.reload().status == "paused"
    assert WorkflowEvent.objects.get(run_id=wf.record.pk, kind="paused").reason == "x" * MAX_REASON_LENGTH


@pytest.mark.django_db(transaction=True)
def test_a_real_process_names_the_limit_of_the_reason():
    wf = ThreeSteps.start()
    code, out, err = finish(manage("pause", wid(wf), "--reason", "x" * 100_000))  # the OS caps one argument at 128 KiB
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        "manage.py workflows pause: error: argument --reason: at most 2000 characters (as in the admin), got 100000"
    )
    assert wf.reload().status == "ready"
    code, out, err = finish(manage("schedules", "pause", "1", "--reason", "x" * 2001))
    assert code == 2 and "at most 2000 characters" in err


def test_the_dispatcher_says_in_one_line_that_the_database_is_unreachable():
    env = {**os.environ, "DATABASE_URL": f"postgres://nobody@127.0.0.1:{closed_port()}/nothing"}
    done = subprocess.run(
        [sys.executable, "manage.py", "run_workflow_dispatcher", "--once"],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("Cannot use the database: connection failed:"), done.stderr
