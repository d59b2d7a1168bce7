"""The example project on SQLite, end to end, in subprocesses (the main suite runs on PostgreSQL).

A fresh SQLite file is migrated; ``manage.py demo --quick`` then runs steps (the signup drip),
signals and a wait timeout (the orders) and a fan-out (the albums) with a real dispatcher,
and ``manage.py test example_project`` runs the example apps' own tests on SQLite.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def sqlite_env(path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGBUS_WORKFLOWS")}
    return {**env, "DATABASE_URL": f"sqlite:///{path}", "DJANGO_SETTINGS_MODULE": "example_project.settings"}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A migrated SQLite database for the example project."""
    environment = sqlite_env(tmp_path_factory.mktemp("sqlite") / "smoke.sqlite3")
    result = manage(environment, "migrate", "--noinput")
    assert result.returncode == 0, result.stdout + result.stderr
    return environment


@pytest.fixture(scope="module")
def first_demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``manage.py demo --quick`` run once on the fresh database, before any other demo (in any test order)."""
    return manage(env, "demo", "--quick", timeout=60)


def test_the_quick_demo_ends_every_run_as_designed_on_sqlite(first_demo):
    result = first_demo
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.splitlines()[0].startswith("pgbus-workflows demo on SQLite (")
    assert re.search(r"^  signup_drip +3 finished, 1 cancelled$", out, re.M), out  # steps, skip_if, cancel_if
    assert re.search(r"^  shop_order +2 finished, 1 cancelled, 1 paused$", out, re.M), out  # signals, timeout
    assert re.search(r"^  shop_order_function +2 finished$", out, re.M), out  # a durable function: paid, released
    assert re.search(r"^  gallery_album +2 finished$", out, re.M), out  # fan-out
    assert re.search(r"^  gallery_import +1 finished$", out, re.M), out  # child workflows
    assert "Alan Turing's import: finished (2 child albums)" in out
    # A schedule every 2 seconds for 5 seconds: each tick its own run, all finished. Two or three
    # ticks on a quiet machine; a loaded one can make the dispatcher's leader fire its first late.
    reports = re.search(r"^  shop_sales_report +([123]) finished$", out, re.M)
    assert reports, out
    fired = int(reports.group(1))
    assert re.search(rf"the schedule fired {fired} sales report\(s\) \(ticks [0-9:, ]+\); paused it", out), out
    expected = rf"^All {13 + fired} runs ended as designed: {10 + fired} finished, 2 cancelled, 1 paused\.$"
    assert re.search(expected, out, re.M), out
    assert "images: 14 of 15 got a thumbnail" in out
    assert "\x1b[" not in out  # not a terminal: plain lines, no redrawing, no colour
    assert "http://127.0.0.1:8000/admin/" in out


def test_the_demo_runs_again_on_the_same_database(env, first_demo):
    assert first_demo.returncode == 0, first_demo.stdout + first_demo.stderr
    result = manage(env, "demo", "--quick", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    fired = re.search(r"the schedule fired (\d+) sales report", first_demo.stdout)
    assert fired, first_demo.stdout
    removed = f"Removed the sample data and the {15 + int(fired.group(1))} runs of an earlier demo."
    assert removed in result.stdout, result.stdout


def test_the_example_apps_tests_pass_on_sqlite(env):
    result = manage(env, "test", "example_project", "--noinput", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^OK$", result.stderr, re.M), result.stderr


def test_check_warns_when_two_dispatchers_share_the_sqlite_file(env):
    add = (
        "from pgbus_workflows.models import Dispatcher as D; "
        "[D.objects.create(name=n, hostname='h', pid=1) for n in 'ab']"
    )
    assert manage(env, "shell", "-c", add).returncode == 0
    try:
        result = manage(env, "check", "--fail-level", "WARNING")
        assert result.returncode == 1
        assert "pgbus_workflows.W002" in result.stderr
    finally:
        remove = "from pgbus_workflows.models import Dispatcher; Dispatcher.objects.filter(name__in='ab').delete()"
        assert manage(env, "shell", "-c", remove).returncode == 0
    result = manage(env, "check", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stderr


def test_check_on_a_fresh_clone_does_not_fail(tmp_path):
    result = manage(sqlite_env(tmp_path / "not-yet.sqlite3"), "check", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stderr


def test_our_checks_do_not_create_a_missing_sqlite_database(tmp_path):
    # Django 6's own model checks open the database during `check`; ours must not.
    database = tmp_path / "not-yet.sqlite3"
    probe = (
        "import django; django.setup()\n"
        "from pgbus_workflows import checks\n"
        "for check in (checks.check_settings, checks.check_database, checks.check_sqlite_transaction_mode,"
        " checks.check_sqlite_dispatchers):\n"
        "    assert not [m for m in check(databases=['default']) if m.level >= 40], check\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=sqlite_env(database), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert not database.exists()


def test_the_demo_asks_for_migrate_first(tmp_path):
    result = manage(sqlite_env(tmp_path / "empty.sqlite3"), "demo", "--quick")
    assert result.returncode == 1
    assert "run `python manage.py migrate`" in result.stderr


def test_on_sqlite_a_dispatcher_passes_over_steps_its_code_lacks(env):
    probe = (
        "from pgbus_workflows.models import WorkflowRun, WorkflowStep\n"
        "from pgbus_workflows.services.claims import claim_due_steps\n"
        "run = WorkflowRun.objects.create(workflow_class='from_newer_code', current_step='x')\n"
        "WorkflowStep.objects.create(run=run, step_name='x', queue='workflows')\n"
        "first = claim_due_steps(10)\n"
        "second = claim_due_steps(10)\n"
        "print('claimed', len(first), len(second), WorkflowStep.objects.get(run=run).status)\n"
        "run.delete()\n"
    )
    result = manage(env, "shell", "-c", probe)
    assert result.returncode == 0, result.stderr
    assert "claimed 0 0 scheduled" in result.stdout


START_MANY_ON_SQLITE = """
import django; django.setup()
from django.core.management import call_command; call_command("migrate", verbosity=0)
from tests.testapp.workflows import NoOp3
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.executor import run_due_steps
from django.db import connection
inserts = []
def count(execute, sql, params, many, context):
    if sql.startswith('INSERT INTO "pgbus_workflows_workflowrun"'):
        inserts.append(len(params))
    return execute(sql, params, many, context)
with connection.execute_wrapper(count):
    handles = NoOp3.start_many([{"arguments": {"n": n}, "idempotency_key": f"k{n}"} for n in range(1200)])
assert len(inserts) == 3 and max(inserts) < 32766, inserts  # chunks of 500 rows, under SQLite's default cap
(again,) = NoOp3.start_many([{"arguments": {"n": 5}, "idempotency_key": "k5"}])
assert again.duplicate_start and again.workflow_id == handles[5].workflow_id
counts = [model.objects.count() for model in (WorkflowRun, WorkflowStep, WorkflowEvent)]
assert counts == [1200, 1200, 1200], counts
assert run_due_steps(limit=1200) == 1200  # each run's first step: the rows written in chunks run
assert set(WorkflowRun.objects.values_list("current_step", flat=True)) == {"b"}
assert WorkflowStep.objects.filter(step_name="a", status="completed").count() == 1200
print("ok")
"""


def test_start_many_writes_in_chunks_on_sqlite(tmp_path):
    """SQLite caps a statement's parameters (32,766 by default): 1,200 runs go in chunks of 500."""
    env = {**sqlite_env(tmp_path / "many.sqlite3"), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", START_MANY_ON_SQLITE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


DEBOUNCE_ON_SQLITE = """
import django; django.setup()
from django.core.management import call_command; call_command("migrate", verbosity=0)
from datetime import timedelta
from pgbus_workflows import Debounce, Workflow, step
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_step
from pgbus_workflows.services.executor import execute_step

class AccountSync(Workflow):
    name = "sqlite_account_sync"
    allow_multiple = True
    debounce = Debounce(period=30, key=lambda wf: f"account:{wf.arguments['account_id']}", max_wait=300)

    @step
    def push(self):
        return self.arguments

first = AccountSync.start(idempotency_key="d1", account_id=1, note="a")
step_row = WorkflowStep.objects.get(run_id=first.record.pk)
assert step_row.scheduled_at - first.record.created_at == timedelta(seconds=30)
second = AccountSync.start(idempotency_key="d2", account_id=1, note="b")
assert second.debounced and second.workflow_id == first.workflow_id
run = WorkflowRun.objects.get(pk=first.record.pk)
assert (run.debounce_key, run.arguments) == ("account:1", {"account_id": 1, "note": "b"}), run.arguments
[event] = WorkflowEvent.objects.filter(run=run, kind="debounced")
assert event.details["idempotency_key"] == "d2" and event.reason.startswith("push moved from "), event.reason
moved = WorkflowStep.objects.get(pk=step_row.pk).scheduled_at
assert moved > step_row.scheduled_at
for key, note in (("d1", "a"), ("d2", "b")):  # repeats: the run, nothing moved
    again = AccountSync.start(idempotency_key=key, account_id=1, note=note)
    assert again.duplicate_start and not again.debounced and again.workflow_id == first.workflow_id
assert WorkflowStep.objects.get(pk=step_row.pk).scheduled_at == moved
assert WorkflowEvent.objects.filter(kind="debounced").count() == 1
other = AccountSync.start(account_id=2)
assert not other.debounced and other.workflow_id != first.workflow_id
execute_step(claim_step(step_row.pk, "sqlite"))  # the first step began (and ended): a start is a new run
assert WorkflowRun.objects.get(pk=run.pk).status == "finished"
fresh = AccountSync.start(account_id=1, note="c")
assert not fresh.debounced and fresh.workflow_id != first.workflow_id
assert AccountSync.start(account_id=1, note="d").workflow_id == fresh.workflow_id
print("ok")
"""


def test_debounce_collapses_starts_and_answers_repeated_keys_on_sqlite(tmp_path):
    """The collapse without PostgreSQL's advisory lock (SQLite has one writer at a time) and migration 0014's index."""
    env = {**sqlite_env(tmp_path / "debounce.sqlite3"), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", DEBOUNCE_ON_SQLITE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


LIMITS_ON_SQLITE = """
import django; django.setup()
from django.core.management import call_command; call_command("migrate", verbosity=0)
from datetime import timedelta
from pgbus_workflows import Concurrency, RateLimit, Workflow, step
from pgbus_workflows.models import WorkflowLimiter, WorkflowRun
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step

class Sync(Workflow):
    name = "sqlite_limited_sync"
    allow_multiple = True
    step_options = {"queue": "sqlite_limits"}
    concurrency = Concurrency(key=lambda wf: f"account:{wf.arguments['account_id']}", limit=1)

    @step(rate_limit=RateLimit("sqlite-api", limit=3, per=timedelta(hours=1)))
    def push(self):
        return None

runs = [Sync.start(account_id=1) for _ in range(3)] + [Sync.start(account_id=2)]
claimed = claim_due_steps(10, queues=["sqlite_limits"])
# The key of account 1 has one slot: its second and third runs are passed over, account 2 goes.
assert sorted(s.run_id for s in claimed) == [runs[0].record.pk, runs[3].record.pk], claimed
slots = dict(WorkflowLimiter.objects.values_list("name", "in_use"))
assert slots["concurrency:account:1"] == 1 and slots["concurrency:account:2"] == 1, slots
for step_row in claimed:
    execute_step(step_row)
assert WorkflowLimiter.objects.get(name="concurrency:account:1").in_use == 0
[third] = claim_due_steps(10, queues=["sqlite_limits"])  # a slot again, and the bucket's last token
assert third.run_id == runs[1].record.pk
assert claim_due_steps(10, queues=["sqlite_limits"]) == []  # no token left for the last run
execute_step(third)
assert WorkflowRun.objects.filter(workflow_class=Sync.name, status="finished").count() == 3
print("ok")
"""


def test_limits_hold_in_the_claim_through_the_orm_on_sqlite(tmp_path):
    """Slots and tokens taken under the run's lock by the ORM's claim (SQLite: one writer at a time)."""
    env = {**sqlite_env(tmp_path / "limits.sqlite3"), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", LIMITS_ON_SQLITE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
