"""Durable functions through real ``run_workflow_dispatcher`` processes: to their result, and across a SIGKILL."""

import signal

import pytest

from tests.procs import eventually
from tests.testapp.durable_workflows import durable_journey, durable_killed
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SETTINGS = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 3, "POLL_INTERVAL": 0.2}


def count(label):
    return SideEffect.objects.filter(label=label).count()


def test_a_function_with_a_loop_a_sleep_and_a_signal_wait_runs_to_its_result(dispatchers):
    run = durable_journey.start(None, pages=5)
    process = dispatchers("--concurrency", "2", settings=SETTINGS)
    eventually(lambda: run.reload().status == "waiting", timeout=60, what="the wait for go")
    run.signal("go", {"ok": True})
    assert run.result(timeout=60) == {"total": 10, "go": {"ok": True}}
    process.send(signal.SIGTERM)
    assert process.wait() == 0, process.output()
    assert [count(f"page {n}") for n in range(5)] == [1] * 5  # replays after the sleep and the wait called none


def test_a_sigkill_mid_checkpoint_loses_nothing_and_replays(dispatchers):
    run = durable_killed.start(None)
    first = dispatchers("--concurrency", "2", settings=SETTINGS)
    eventually(lambda: count("blocking") == 1, timeout=60, what="the blocking checkpoint to run")
    first.kill()
    SideEffect.objects.create(label="release")
    second = dispatchers("--concurrency", "2", settings=SETTINGS)
    assert run.result(timeout=90) == "done"
    second.send(signal.SIGTERM)
    assert second.wait() == 0, second.output()
    # Only the checkpoint in flight ran twice; the one before it was replayed.
    assert (count("before"), count("blocking"), count("after")) == (1, 2, 1)
