"""A checkpoint of another queue through real dispatcher processes: each queue's dispatcher runs its own."""

import signal

import pytest

from pgbus_workflows.conf import settings
from tests.testapp.models import SideEffect
from tests.testapp.routed_workflows import SLOW_QUEUE, durable_routed_processes

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SETTINGS = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 3, "POLL_INTERVAL": 0.2}


def test_a_checkpoint_of_another_queue_runs_on_that_queues_dispatcher_and_the_function_goes_on(dispatchers):
    runs = [durable_routed_processes.start(None) for _ in range(3)]
    default = dispatchers("--queue", settings.DEFAULT_QUEUE, "--concurrency", "2", settings=SETTINGS)
    slow = dispatchers("--queue", SLOW_QUEUE, "--concurrency", "2", settings=SETTINGS)
    results = [run.result(timeout=90) for run in runs]
    for process in (default, slow):
        process.send(signal.SIGTERM)
        assert process.wait() == 0, process.output()
    pids = {"default": default.proc.pid, "slow": slow.proc.pid}
    for result in results:
        assert result["there"] == pids["slow"]
        assert result["here"] == pids["default"]
    # Each body ran once per run: replays after the reroute called none again.
    counts = {label: SideEffect.objects.filter(label=label).count() for label in ("here", "there", "back")}
    assert counts == {"here": 3, "there": 3, "back": 3}
