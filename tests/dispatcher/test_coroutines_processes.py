"""A real ``run_workflow_dispatcher`` awaiting ``async def`` bodies on its event loop.

Bodies wait for a file the test creates, so what is counted is read while none has ended.
"""

import signal

import pytest
from django.core.management import CommandError, call_command

from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from tests.procs import eventually
from tests.testapp.async_workflows import (
    BlocksTheLoop,
    EchoServer,
    FileGated,
    NeverReturns,
    SwallowsCancel,
    UsesSharedClient,
)
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FAST = {"POLL_INTERVAL": 0.2}


def began():
    return SideEffect.objects.filter(label="file-gated-began").count()


def test_one_thread_awaits_thirty_bodies_and_sigterm_lets_them_finish(dispatchers, tmp_path):
    gate = tmp_path / "open"
    runs = FileGated.start_many([{"arguments": {"n": n, "gate": str(gate)}} for n in range(30)])
    process = dispatchers("--concurrency", "1", "--async-concurrency", "50", settings=FAST)
    eventually(lambda: began() == 30, timeout=60, what="thirty bodies awaiting at once on one thread")

    process.send(signal.SIGTERM)
    eventually(lambda: "finishing running steps" in process.output(), what="the signal to be logged")
    gate.touch()

    assert process.wait(timeout=60) == 0, process.output()
    calls = WorkflowStep.objects.filter(step_name="call", run__in=[wf.record for wf in runs])
    assert set(calls.values_list("status", "outcome")) == {("completed", "success")}, process.output()
    assert "(and 50 async bodies)" in process.output()


def test_past_the_shutdown_timeout_awaiting_bodies_are_cancelled_and_their_attempts_stalled(dispatchers, tmp_path):
    FileGated.start_many([{"arguments": {"n": n, "gate": str(tmp_path / "never")}} for n in range(3)])
    process = dispatchers("--shutdown-timeout", "1", settings=FAST)
    eventually(lambda: began() == 3, timeout=60, what="three bodies awaiting")

    process.send(signal.SIGTERM)

    assert process.wait(timeout=60) == 0, process.output()
    stalled = WorkflowEvent.objects.filter(kind="step_stalled")
    assert sorted(stalled.values_list("details__detection", flat=True)) == ["shutdown_timeout"] * 3, process.output()


def test_a_body_blocking_the_loop_is_named_in_the_log(dispatchers):
    wf = BlocksTheLoop.start()
    process = dispatchers("--once")
    assert process.wait(timeout=60) == 0, process.output()
    assert wf.reload().status == "finished"
    assert f"async_blocks_the_loop {wf.workflow_id} step blocks (attempt 1) held the event loop for 0.3" in (
        process.output()
    )


def test_a_negative_async_concurrency_is_refused():
    with pytest.raises(CommandError, match="must not be negative"):
        call_command("run_workflow_dispatcher", "--async-concurrency", "-1")


@pytest.mark.parametrize("places", ["2", "0"])
def test_a_module_level_async_client_serves_every_body_of_a_dispatcher(dispatchers, places):
    with EchoServer() as server:
        runs = UsesSharedClient.start_many([{"arguments": {"n": n, "port": server.port}} for n in range(24)])
        process = dispatchers("--concurrency", "4", "--async-concurrency", places, settings=FAST)
        finished = WorkflowRun.objects.filter(workflow_class=UsesSharedClient.name, status="finished")
        eventually(lambda: finished.count() == 24, timeout=90, what="the 24 runs to finish")
    assert not WorkflowRun.objects.filter(status="paused").exists()
    assert sorted(int(wf.reload().outputs["call"]) for wf in runs) == list(range(24)), process.output()
    assert "Step failed" not in process.output()


def test_a_stalled_attempts_body_is_cancelled_and_one_that_will_not_end_is_logged(dispatchers):
    NeverReturns.start()
    SwallowsCancel.start()
    settings = {
        **FAST,
        "STALL_THRESHOLD": 1,
        "SWEEP_INTERVAL": 0.5,
        "HEARTBEAT_INTERVAL": 0.5,
        "STALL_ACTION": "cancel",
    }
    process = dispatchers("--concurrency", "1", "--async-concurrency", "2", settings=settings)

    eventually(lambda: "swallows CancelledError" in process.output(), timeout=60, what="the unending body logged")
    output = process.output()
    assert "Cancelled 1 async bod" in output or "Cancelled 2 async bod" in output
    assert SideEffect.objects.filter(label="never-returns-cancelled").count() == 1
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"cancelled"}
    assert "async_swallows_cancel" in output.split("swallows CancelledError")[0].splitlines()[-1]


def test_with_no_places_sigterm_past_the_timeout_cancels_the_held_bodies_and_stalls_them(dispatchers, tmp_path):
    FileGated.start_many([{"arguments": {"n": n, "gate": str(tmp_path / "never")}} for n in range(2)])
    process = dispatchers("--concurrency", "2", "--async-concurrency", "0", "--shutdown-timeout", "1", settings=FAST)
    eventually(lambda: began() == 2, timeout=60, what="two bodies, each held by its worker")

    process.send(signal.SIGTERM)

    assert process.wait(timeout=60) == 0, process.output()
    stalled = WorkflowEvent.objects.filter(kind="step_stalled")
    assert sorted(stalled.values_list("details__detection", flat=True)) == ["shutdown_timeout"] * 2, process.output()
