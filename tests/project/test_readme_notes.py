"""What a newcomer had to find in the source, now in the docs (issue #19): each note held by a test.

The others are held elsewhere: ``deliver_signal()`` running the step it wakes and
``expire_wait()`` running nothing (``test_signals.py``, ``SignalHelperTests``),
``fan_out_results()`` being an iterator with None for failed jobs (``test_fanout.py``), start
arguments read back as JSON (``test_start.py``).
"""

import os
import subprocess
import sys
from datetime import date
from decimal import Decimal

import environ
import pytest
from django.db import connection

from pgbus_workflows.models import FanOutJob, WorkflowStep
from pgbus_workflows.testing import WorkflowTestMixin
from tests.procs import ROOT
from tests.testapp.models import SideEffect
from tests.testapp.workflows import Approval, FanJsonArguments, FanWritesThenFails

helpers = WorkflowTestMixin()


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_fan_out_jobs_run_outside_a_transaction_so_what_a_failed_job_wrote_stays(dispatchers):
    wf = FanWritesThenFails.start()
    process = dispatchers("--once", settings={"POLL_INTERVAL": 0.2})
    assert process.wait() == 0, process.output()

    assert wf.reload().status == "finished", process.output()
    failed = FanOutJob.objects.get(run_id=wf.record.pk, index=0)
    assert failed.status == "failed" and "job 0 fails on purpose" in failed.error
    # The row job 0 wrote before it raised is committed: no transaction rolled it back.
    assert list(SideEffect.objects.filter(label="fail_on").values_list("key", flat=True)) == ["0"]
    after = WorkflowStep.objects.get(run_id=wf.record.pk, step_name="after")
    # fan_out_results(): the failed job's result is None; the other job ran in autocommit.
    assert after.output == {"results": [None, {"in_atomic_block": False, "autocommit": True}]}


@pytest.mark.django_db
def test_job_arguments_and_signal_payloads_arrive_as_djangojsonencoder_made_them():
    wf = FanJsonArguments.start()
    helpers.perform_next_step(wf)
    helpers.complete_fan_out(wf)
    helpers.perform_next_step(wf)
    received = WorkflowStep.objects.get(run_id=wf.record.pk, step_name="after").output["received"]
    assert received == [
        {"types": ["str", "str", "str", "list"], "values": ["2024-01-02", "1.50", "2024-01-02T03:04:05.123Z", [1, 2]]}
    ]

    approval = Approval.start()
    helpers.perform_next_step(approval)
    helpers.deliver_signal(approval, "approved", {"on": date(2024, 1, 2), "amount": Decimal("9.99")})
    output = WorkflowStep.objects.get(run_id=approval.record.pk, step_name="approve").output
    assert output == {"on": "2024-01-02", "amount": "9.99"}


#: A pytest run of its own: file order, no cache, the skip reasons shown.
PYTEST_ALONE = ("-p", "no:randomly", "-p", "no:cacheprovider", "-q", "-rs")


@pytest.mark.processes
def test_the_browser_tests_are_skipped_without_chromium(tmp_path):
    env = {
        **os.environ,
        "PGBUS_TEST_CHROMIUM": str(tmp_path / "no-chromium"),
        # A database no test may touch: were the skip broken, pytest-django would make its own.
        "DATABASE_URL": connection_url("pgbus_browser_skip_check"),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_ALONE, "tests/admin/test_admin_browser.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"no {tmp_path / 'no-chromium'}: run bash scripts/install_chromium" in run.stdout
    assert " skipped" in run.stdout.splitlines()[-1] and "passed" not in run.stdout.splitlines()[-1]


def connection_url(name: str) -> str:
    """DATABASE_URL's server, with another database name."""
    url = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/pgbus_workflows")
    return url.rsplit("/", 1)[0] + f"/{name}"


@pytest.mark.django_db
def test_the_tests_run_in_test_and_the_database_name_of_database_url_one_a_worker(worker_id):
    url = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/pgbus_workflows")
    name = "test_" + environ.Env.db_url_config(url)["NAME"]
    assert connection.settings_dict["NAME"] == (name if worker_id == "master" else f"{name}_{worker_id}")


def test_scripts_test_runs_two_workers_unless_told_otherwise():
    script = (ROOT / "scripts" / "test").read_text()
    assert 'exec "$venv/bin/python" -m pytest -n "${PYTEST_WORKERS:-2}" "$@"' in script
