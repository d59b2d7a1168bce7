"""``python manage.py workflows`` in processes of its own: exit codes, stderr, and two at once."""

import json
import os
import subprocess
import sys

import pytest

from tests.management.test_cli import SHELL_ACTOR, wid
from tests.procs import ROOT, database_url
from tests.services.test_deploy_processes import empty_database  # noqa: F401 (a fixture)
from tests.support import events_of
from tests.testapp.workflows import ThreeSteps

pytestmark = pytest.mark.processes


def manage(*args: str, url: str | None = None) -> subprocess.Popen:
    """``python manage.py workflows ARGS`` in a process of its own, on the test database."""
    env = {**os.environ, "DATABASE_URL": url or database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.Popen(
        [sys.executable, "manage.py", "workflows", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


@pytest.mark.django_db(transaction=True)
def test_a_real_process_exits_0_when_done_and_1_with_one_line_on_stderr_when_refused():
    wf = ThreeSteps.start()
    code, out, err = finish(manage("pause", wid(wf), "--reason", "from a shell"))
    assert (code, out, err) == (0, f"{wid(wf)}  paused (now paused, step one)\n", "")
    assert [(e.actor, e.reason) for e in events_of(wf, "paused")] == [(SHELL_ACTOR, "from a shell")]

    code, out, err = finish(manage("pause", wid(wf)))
    assert (code, out, err) == (1, "", f"CommandError: {wid(wf)}: Cannot pause a paused workflow\n")

    code, out, err = finish(manage("list", "--json", "--status", "paused"))
    assert code == 0, err
    assert [(row["workflow_id"], row["status"]) for row in json.loads(out)] == [(wid(wf), "paused")]

    code, out, err = finish(manage("list", "--status", "nope"))
    assert (code, out) == (2, "")  # argparse: its usage, then the error
    assert err.splitlines()[-1].startswith("manage.py workflows list: error: argument --status: invalid choice: 'nope'")

    code, out, err = finish(manage("show", "nope"))
    assert (code, out) == (1, "")
    assert err == "CommandError: 'nope' is not a workflow id (its 32 hex digits, or the first 8 or more)\n"


@pytest.mark.django_db(transaction=True)
def test_two_processes_cancelling_one_run_cancel_it_once():
    wf = ThreeSteps.start()
    first, second = manage("cancel", wid(wf), "--actor", "one"), manage("cancel", wid(wf), "--actor", "two")
    results = sorted([finish(first), finish(second)])
    assert [code for code, _out, _err in results] == [0, 1]
    assert results[1][2] == f"CommandError: {wid(wf)}: Cannot cancel a cancelled workflow\n"
    assert [e.actor for e in events_of(wf, "cancelled")] in (["one"], ["two"])
    assert wf.reload().status == "cancelled"


def test_before_migrate_the_command_says_run_migrate_in_one_line(empty_database):  # noqa: F811
    code, out, err = finish(manage("list", url=empty_database))
    assert (code, out) == (1, "")
    assert err.startswith("CommandError: The database lacks pgbus_workflows migrations (pgbus_workflows.0001_initial")
    assert err.endswith("run `python manage.py migrate`\n") and "Traceback" not in err
