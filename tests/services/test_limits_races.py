"""Slots under concurrent claims and outcomes: real threads, each with its own connection, against PostgreSQL."""

import threading
import time
from collections import defaultdict

import pytest

from pgbus_workflows import Concurrency, Workflow, step
from pgbus_workflows.models import WorkflowLimiter, WorkflowRun
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "limits_race"
LIMIT = 2
_guard = threading.Lock()
_in_flight: dict[str, int] = defaultdict(int)
_most: dict[str, int] = defaultdict(int)


def _enter(key: str) -> None:
    with _guard:
        _in_flight[key] += 1
        _most[key] = max(_most[key], _in_flight[key])


def _leave(key: str) -> None:
    with _guard:
        _in_flight[key] -= 1


class RacedLanes(Workflow):
    """Two steps per run; the bodies of one lane count themselves in and out."""

    name = "limits_raced_lanes"
    allow_multiple = True
    step_options = {"queue": QUEUE}
    concurrency = Concurrency(key=lambda wf: f"race-lane:{wf.arguments['lane']}", limit=LIMIT)

    def _body(self):
        key = self.arguments["lane"]
        _enter(key)
        try:
            time.sleep(0.005)  # long enough for the other threads' claims to come while it runs
        finally:
            _leave(key)

    @step
    def first(self):
        self._body()

    @step
    def second(self):
        self._body()


def _drain(deadline: float) -> int:
    ran = 0
    while time.monotonic() < deadline:
        claimed = claim_due_steps(2, queues=[QUEUE], claimed_by=threading.current_thread().name)
        if not claimed and not WorkflowRun.objects.ongoing().filter(workflow_class=RacedLanes.name).exists():
            return ran
        for step_row in claimed:
            execute_step(step_row)
            ran += 1
    return ran


def test_four_threads_claiming_and_ending_steps_never_hold_more_slots_than_the_limit():
    _in_flight.clear()
    _most.clear()
    RacedLanes.start_many([{"arguments": {"lane": str(n % 3)}} for n in range(36)])

    workers = [Worker(_drain, time.monotonic() + 60) for _ in range(4)]
    for worker in workers:
        worker.start()
    ran = sum(worker.finish() for worker in workers)

    assert ran == 72
    assert WorkflowRun.objects.filter(workflow_class=RacedLanes.name, status="finished").count() == 36
    assert max(_most.values()) <= LIMIT, dict(_most)
    assert set(_most) == {"0", "1", "2"}
    slots = dict(
        WorkflowLimiter.objects.filter(name__startswith="concurrency:race-lane:").values_list("name", "in_use")
    )
    assert slots == {f"concurrency:race-lane:{n}": 0 for n in range(3)}
