"""Tasks run by real ``run_workflow_dispatcher`` processes: a SIGKILL mid-task, two dispatchers."""

import signal
from collections import Counter

import pytest

from pgbus_workflows.tasks.api import TaskResultStatus
from tests.procs import eventually
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FAST = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 2, "POLL_INTERVAL": 0.2}


def finished(result):
    def check():
        result.refresh()
        return result.is_finished

    return check


def test_a_task_killed_mid_run_is_run_again_by_another_dispatcher(dispatchers):
    result = tasks.hangs_first_time.enqueue("k")
    victim = dispatchers("--no-sweep", settings=FAST)
    eventually(lambda: SideEffect.objects.filter(label="hangs-start").exists(), what="the task to start")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING

    victim.kill()
    dispatchers(settings=FAST)
    eventually(finished(result), timeout=60, what="the task to run again after the crash")

    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, "done", 2)
    assert result.errors[0].exception_class_path == "pgbus_workflows.exceptions.StepStalled"
    assert len(set(result.worker_ids)) == 2, "each attempt names its own dispatcher"


def test_two_dispatchers_run_each_of_a_hundred_tasks_once(dispatchers):
    results = [tasks.noted.enqueue(n) for n in range(100)]
    first = dispatchers("--concurrency", "3", settings=FAST)
    second = dispatchers("--concurrency", "3", settings=FAST)

    eventually(lambda: SideEffect.objects.filter(label="noted").count() >= 100, timeout=60, what="100 tasks")
    for result in results:
        eventually(finished(result), what=f"task {result.id}")
        assert result.status == TaskResultStatus.SUCCESSFUL
    ran = Counter(SideEffect.objects.filter(label="noted").values_list("key", flat=True))
    assert len(ran) == 100 and set(ran.values()) == {1}, "a task ran twice"
    first.send(signal.SIGTERM)
    second.send(signal.SIGTERM)
    assert first.wait() == 0 and second.wait() == 0


def test_a_task_running_past_the_stall_threshold_is_taken_for_hung_and_run_again(dispatchers):
    result = tasks.hangs_first_time.enqueue("slow")
    dispatchers(settings={**FAST, "STALL_THRESHOLD": 1, "SWEEP_INTERVAL": 0.2})
    eventually(finished(result), timeout=60, what="the hung task to be stalled and run again")
    assert (result.status, result.attempts) == (TaskResultStatus.SUCCESSFUL, 2)
    assert result.errors[0].exception_class_path == "pgbus_workflows.exceptions.StepStalled"
