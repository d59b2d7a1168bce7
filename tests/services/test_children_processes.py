"""Child workflows through real ``run_workflow_dispatcher`` processes: no child twice, whatever dies when."""

import signal

import psycopg
import pytest

from pgbus_workflows.models import WorkflowRun
from tests.procs import database_url, eventually
from tests.support import sessions_waiting_for_a_lock
from tests.testapp.child_workflows import Many
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SETTINGS = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 3, "POLL_INTERVAL": 0.2}
#: The statement of a park (the fan-out writing its events), as pg_stat_activity shows it.
EVENT_INSERT = 'INSERT INTO "pgbus_workflows_workflowevent"'


def children():
    return WorkflowRun.objects.filter(workflow_class="slow_child")


def test_a_parent_and_its_children_end_through_a_dispatcher(dispatchers):
    wf = Many.start(count=10)
    process = dispatchers("--concurrency", "4", settings=SETTINGS)
    assert wf.result(timeout=60) == sum(range(10))
    process.send(signal.SIGTERM)
    assert process.wait() == 0, process.output()
    assert children().count() == 10
    assert set(children().values_list("status", flat=True)) == {"finished"}


def test_a_sigkill_between_starting_children_and_parking_starts_no_child_twice(dispatchers):
    wf = Many.start(count=5, pause=1.0)
    first = dispatchers("--concurrency", "2", settings=SETTINGS)
    eventually(lambda: SideEffect.objects.filter(label="spawn").exists(), timeout=60, what="the body to run")
    url = database_url()
    with psycopg.connect(url) as blocker:
        # Hold the events table: the park inserts the jobs and the children's runs, then waits, its transaction open.
        blocker.execute('LOCK TABLE "pgbus_workflows_workflowevent" IN SHARE MODE')
        with psycopg.connect(url, autocommit=True) as observer:
            eventually(
                lambda: sessions_waiting_for_a_lock(EVENT_INSERT, observer), timeout=30, what="the park mid-transaction"
            )
        first.kill()
        blocker.rollback()
    assert children().count() == 0  # the children were started in the park's transaction: gone with it

    second = dispatchers("--concurrency", "2", settings=SETTINGS)
    assert wf.result(timeout=90) == sum(range(5))
    second.send(signal.SIGTERM)
    assert second.wait() == 0, second.output()
    assert sorted(run.arguments["n"] for run in children()) == [0, 1, 2, 3, 4]
    assert list(SideEffect.objects.filter(label="spawn").values_list("key", flat=True)) == ["1", "2"]
