"""``ctx.map`` and ``ctx.child`` through real ``run_workflow_dispatcher`` processes, end to end."""

import signal

import pytest

from pgbus_workflows.models import Dispatcher, FanOutJob, WorkflowRun
from tests.procs import eventually
from tests.testapp.durable_workflows import durable_gather, durable_map_killed
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def count(label):
    return SideEffect.objects.filter(label=label).count()


SETTINGS = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 3, "POLL_INTERVAL": 0.2}


def test_a_map_then_a_step_class_child_then_a_durable_child_run_to_the_result_on_two_dispatchers(dispatchers):
    run = durable_gather.start(None, numbers=[1, 2, 3, 4])
    first = dispatchers("--concurrency", "2", settings=SETTINGS)
    second = dispatchers("--concurrency", "2", settings=SETTINGS)
    assert run.result(timeout=90) == {"squares": [1, 4, 9, 16], "doubled": 60, "tripled": 180}
    # A run done before the second one is up would meet a SIGTERM before its handlers are.
    eventually(lambda: Dispatcher.objects.count() == 2, timeout=60, what="both dispatchers to register")
    for process in (first, second):
        process.send(signal.SIGTERM)
    for process in (first, second):
        assert process.wait() == 0, process.output()
    # Every job ran once and each child was started once, whatever process ended the jobs.
    assert sorted(SideEffect.objects.filter(label="square").values_list("key", flat=True)) == ["1", "2", "3", "4"]
    assert FanOutJob.objects.filter(run_id=run.record.pk, function="tests.testapp.jobs.square").count() == 4
    children = WorkflowRun.objects.filter(parent_id=run.record.pk).order_by("pk")
    assert [c.workflow_class for c in children] == ["durable_doubler", "durable_tripler"]
    ran = [SideEffect.objects.filter(label=label).count() for label in ("double", "triple")]
    assert ran == [1, 1]


def test_a_dispatcher_sigkilled_while_map_jobs_run_leaves_them_to_the_next_one(dispatchers):
    run = durable_map_killed.start(None)
    first = dispatchers("--concurrency", "2", settings=SETTINGS)
    eventually(lambda: count("map-blocking") == 2, timeout=60, what="both jobs to run")
    first.kill()
    SideEffect.objects.create(label="release")
    second = dispatchers("--concurrency", "2", settings=SETTINGS)
    assert run.result(timeout=90) == ["a", "b"]
    second.send(signal.SIGTERM)
    assert second.wait() == 0, second.output()
    # The jobs in flight at the kill ran again; the checkpoint before the map was replayed.
    assert (count("before"), count("map-blocking")) == (1, 4)
