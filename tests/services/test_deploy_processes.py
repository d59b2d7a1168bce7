"""Deploys with real dispatcher processes running different code (``TESTAPP_CODE=old``) beside the new.

The test process is the web tier, already on the new code of ``tests/testapp/deploy_workflows.py``.
"""

import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

import pgbus_workflows
from pgbus_workflows.models import Dispatcher, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_step
from pgbus_workflows.services.executor import execute_step
from tests.procs import ROOT, database_url, eventually
from tests.testapp.deploy_workflows import Evolving, NewOnly, Retiring
from tests.testapp.models import SideEffect
from tests.testapp.workflows import Counted

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FAST = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 2, "POLL_INTERVAL": 0.2}
OLD = {"TESTAPP_CODE": "old"}


def status(wf):
    return wf.reload().status


def a_whole_sweep():
    """Return once every phase of a sweep has run after this call.

    Each of two sweeps in turn forgets a dispatcher row gone an hour ago: the first sweep
    read the rows after the first was written, and the second began after the first ended.
    """
    for n in range(2):
        name = f"gone-{n}"
        Dispatcher.objects.create(name=name, hostname="gone", pid=1, heartbeat_at=timezone.now() - timedelta(hours=1))
        forgotten = Dispatcher.objects.filter(name=name)
        eventually(lambda gone=forgotten: not gone.exists(), what=f"a sweep to forget {name}")


def run_first_step_here(wf):
    """The web tier's code runs the first step inline, so the next one is the new code's choice."""
    step = WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled")
    execute_step(claim_step(step.pk))


def test_a_rolling_deploy_leaves_new_steps_to_the_new_dispatchers_and_pauses_nothing(dispatchers):
    evolving = Evolving.start()
    run_first_step_here(evolving)  # the new code schedules "added", a step the old code lacks
    assert evolving.reload().current_step == "added"
    new_only = NewOnly.start()
    counted = Counted.start()

    old = dispatchers("--concurrency", "2", settings=FAST, env=OLD)
    # Claimed after the other two were due: the claims passed over them.
    eventually(lambda: status(counted) == "finished", what="the old dispatcher runs what its code knows")
    a_whole_sweep()

    assert (status(evolving), evolving.current_step) == ("ready", "added")
    assert status(new_only) == "ready"
    assert (
        WorkflowStep.objects.filter(run_id__in=[evolving.record.pk, new_only.record.pk])
        .exclude(status__in=["scheduled", "completed"])
        .count()
        == 0
    ), "no attempt was spent or failed"
    old_catalog = Dispatcher.objects.get().catalog
    assert "deploy_new_only" not in old_catalog and "added" not in old_catalog["deploy_evolving"]

    new = dispatchers("--concurrency", "2", settings=FAST)
    eventually(lambda: status(new_only) == "finished", what="the new dispatcher runs the new class")
    eventually(lambda: (status(evolving), evolving.current_step) == ("waiting", "signoff"), what="the added step")
    assert not WorkflowRun.objects.filter(status="paused").exists(), old.output() + new.output()
    assert SideEffect.objects.filter(label="added").count() == 1


def test_runs_parked_by_the_old_code_on_renamed_and_removed_steps_finish_with_one_approval(dispatchers):
    evolving, retiring = Evolving.start(), Retiring.start()
    old = dispatchers("--once", settings=FAST, env=OLD)
    assert old.wait() == 0, old.output()
    assert (status(evolving), evolving.current_step) == ("waiting", "review")
    assert (status(retiring), retiring.current_step) == ("waiting", "manager_review")

    evolving.signal("approved", "ok")
    retiring.signal("approved", "ok")  # wakes the gravestone: it goes back to pending for manager_signoff
    new = dispatchers("--concurrency", "2", settings=FAST)
    eventually(lambda: status(evolving) == "finished" and status(retiring) == "finished", what="both runs")

    labels = sorted(SideEffect.objects.values_list("label", flat=True))
    assert labels == ["first", "first", "last", "signoff:ok", "signoff:ok"], new.output()


def test_the_sweep_pauses_a_step_only_once_no_live_dispatcher_knows_it(dispatchers):
    grace = {**FAST, "UNKNOWN_STEP_GRACE": 1}
    new_only = NewOnly.start()
    # Due just after it, on a step no code defines: the sweep that pauses it was past the grace
    # for new_only's step too, and looked at it first.
    canary = NewOnly.start()
    WorkflowStep.objects.filter(run_id=canary.record.pk).update(step_name="undefined")
    # A dispatcher with the new code, serving another queue: it cannot take the step, but knows it.
    newer = dispatchers("--queue", "elsewhere", "--no-sweep", settings=grace)
    eventually(lambda: Dispatcher.objects.filter(queues=["elsewhere"]).exists(), what="the newer dispatcher")
    old = dispatchers(settings=grace, env=OLD)
    eventually(lambda: status(canary) == "paused", what="the old dispatcher's sweep to pause the canary")
    assert status(new_only) == "ready", old.output()

    newer.kill()  # no live dispatcher knows the class now: after DISPATCHER_DEAD_AFTER, paused
    eventually(lambda: status(new_only) == "paused", what="the pause", timeout=15)
    assert "StepNotDefined" in new_only.record.paused_reason and "deploy_new_only" in new_only.record.paused_reason
    assert WorkflowStep.objects.get(run_id=new_only.record.pk).status == "scheduled"


@pytest.fixture
def empty_database():
    """A database of its own, with nothing migrated; dropped afterwards."""
    name = f"pgbus_unmigrated_{uuid.uuid4().hex[:8]}"
    params = {"host": connection.settings_dict["HOST"] or "127.0.0.1", "user": connection.settings_dict["USER"]}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = database_url().rsplit("/", 1)[0] + f"/{name}"
    yield url
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_run(url, *args, timeout=60):
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


START = (
    "import django; django.setup()\n"
    "from pgbus_workflows import NotMigrated\n"
    "from tests.testapp.workflows import Counted\n"
    "try:\n    Counted.start()\nexcept NotMigrated as error:\n    print('NotMigrated:', error)\n"
)


def test_before_migrate_the_dispatcher_and_start_say_run_migrate_in_one_line(empty_database):
    dispatcher = django_run(empty_database, "-m", "django", "run_workflow_dispatcher", "--once")
    assert dispatcher.returncode == 1
    assert dispatcher.stdout.strip() == ""
    migrations = Path(pgbus_workflows.__file__).parent / "migrations"
    more = len(list(migrations.glob("[0-9][0-9][0-9][0-9]_*.py"))) - 3
    assert dispatcher.stderr.strip().splitlines() == [
        "The database lacks pgbus_workflows migrations (pgbus_workflows.0001_initial, "
        f"pgbus_workflows.0002_lean_indexes, pgbus_workflows.0003_workers_alive_and_job_stalls and {more} more): "
        "run `python manage.py migrate`"
    ]
    started = django_run(empty_database, "-c", START)
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("NotMigrated: The database lacks pgbus_workflows")
    assert "run `python manage.py migrate`" in started.stdout

    names = sorted(p.stem for p in migrations.glob("[0-9][0-9][0-9][0-9]_*.py"))
    migrated = django_run(empty_database, "-m", "django", "migrate", "pgbus_workflows", names[-3], "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    dispatcher = django_run(empty_database, "-m", "django", "run_workflow_dispatcher", "--once")
    assert dispatcher.returncode == 1
    assert dispatcher.stderr.strip() == (
        f"The database lacks pgbus_workflows migrations (pgbus_workflows.{names[-2]}, "
        f"pgbus_workflows.{names[-1]}): run `python manage.py migrate`"
    )
