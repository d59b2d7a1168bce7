"""``async def`` durable functions through real ``run_workflow_dispatcher`` processes: awaited on the loop."""

import signal

import pytest

from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.states import StepStatus
from tests.procs import eventually
from tests.testapp.durable_workflows import durable_async_journey, durable_async_killed
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SETTINGS = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 3, "POLL_INTERVAL": 0.2}


def count(label):
    return SideEffect.objects.filter(label=label).count()


@pytest.mark.parametrize("places", ["100", "0"])  # 0: a worker waits for the function's end (no free place)
def test_an_async_function_runs_on_the_dispatchers_loop_to_its_result(dispatchers, places):
    run = durable_async_journey.start(None, pages=4)
    process = dispatchers("--concurrency", "2", "--async-concurrency", places, settings=SETTINGS)
    eventually(lambda: run.reload().status == "waiting", timeout=60, what="the wait for go")
    # Parked: no attempt in flight while it waits.
    assert not WorkflowStep.objects.filter(run_id=run.record.pk, status=StepStatus.IN_PROGRESS).exists()
    run.signal("go", {"ok": True})
    assert run.result(timeout=60) == {"total": 6, "go": {"ok": True}, "squares": [1, 4], "tripled": 18}
    process.send(signal.SIGTERM)
    assert process.wait() == 0, process.output()
    # Replays after the sleep, the wait, the map and the child called no body again.
    assert [count(f"async page {n}") for n in range(4)] == [1] * 4
    assert (count("plain"), count("square"), count("triple")) == (1, 2, 1)


def test_a_sigkill_mid_async_checkpoint_loses_nothing_and_replays(dispatchers):
    run = durable_async_killed.start(None)
    first = dispatchers("--concurrency", "2", settings=SETTINGS)
    eventually(lambda: count("async blocking") == 1, timeout=60, what="the blocking checkpoint to run")
    first.kill()
    SideEffect.objects.create(label="release")
    second = dispatchers("--concurrency", "2", settings=SETTINGS)
    assert run.result(timeout=90) == "done"
    second.send(signal.SIGTERM)
    assert second.wait() == 0, second.output()
    # Only the checkpoint in flight ran twice; the one before it was replayed.
    assert (count("before"), count("async blocking"), count("after")) == (1, 2, 1)
