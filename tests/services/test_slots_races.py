"""Slots under concurrent claims, cancels of running bodies and the sweep's repair: real threads, real PostgreSQL."""

import threading
import time
from collections import defaultdict

import pytest

from pgbus_workflows import Concurrency, InvalidTransition, Workflow, step
from pgbus_workflows.models import WorkflowLimiter, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.operator import cancel
from pgbus_workflows.services.slot_sweep import reconcile
from pgbus_workflows.sql import clock
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "slots_race"
LIMIT = 1
_guard = threading.Lock()
_in_flight: dict[str, int] = defaultdict(int)
_most: dict[str, int] = defaultdict(int)
_running: set[int] = set()


class CancelledLanes(Workflow):
    """Two steps per run; each body counts itself in and out of its lane, cancelled or not."""

    name = "slots_cancelled_lanes"
    allow_multiple = True
    step_options = {"queue": QUEUE}
    concurrency = Concurrency(key=lambda wf: f"slots-lane:{wf.arguments['lane']}", limit=LIMIT)

    def _body(self):
        key = self.arguments["lane"]
        with _guard:
            _in_flight[key] += 1
            _most[key] = max(_most[key], _in_flight[key])
            _running.add(self.record.pk)
        try:
            time.sleep(0.2)  # long enough for a cancel and an idle thread's claim to come while it runs
        finally:
            with _guard:
                _in_flight[key] -= 1
                _running.discard(self.record.pk)

    @step
    def first(self):
        self._body()

    @step
    def second(self):
        self._body()


def _ongoing() -> bool:
    return WorkflowRun.objects.ongoing().filter(workflow_class=CancelledLanes.name).exists()


def _drain(deadline: float) -> int:
    ran = 0
    while time.monotonic() < deadline:
        claimed = claim_due_steps(1, queues=[QUEUE], claimed_by=threading.current_thread().name)
        if not claimed and not _ongoing():
            return ran
        for step_row in claimed:
            execute_step(step_row, verify=False)  # a cancel may come while the body runs
            ran += 1
    return ran


def _cancel_running(deadline: float) -> int:
    cancelled = 0
    while time.monotonic() < deadline and _ongoing():
        with _guard:
            running = sorted(_running)
        for pk in running[:1]:  # a run whose body runs now
            try:
                cancel(pk, reason="race")
            except InvalidTransition:  # it ended meanwhile
                continue
            cancelled += 1
    return cancelled


def _repair(deadline: float) -> int:
    repaired = 0
    while time.monotonic() < deadline and _ongoing():
        repaired += reconcile(clock.now())
    return repaired


def test_claims_cancels_of_running_bodies_and_the_repair_together_never_exceed_the_limit_or_repair_a_right_count():
    _in_flight.clear()
    _most.clear()
    _running.clear()
    CancelledLanes.start_many([{"arguments": {"lane": str(n % 2)}} for n in range(20)])

    deadline = time.monotonic() + 60
    drainers = [Worker(_drain, deadline) for _ in range(3)]  # one more than the lanes: one is idle, claiming
    others = [Worker(_cancel_running, deadline), Worker(_repair, deadline)]
    for worker in drainers + others:
        worker.start()
    ran = sum(worker.finish() for worker in drainers)
    cancelled, repaired = (worker.finish() for worker in others)

    assert not _ongoing(), f"{ran} bodies ran; runs left"
    assert cancelled > 0, "no cancel came while a body ran"
    assert repaired == 0, "the repair changed a count that was right"
    assert max(_most.values()) <= LIMIT, dict(_most)
    assert set(
        WorkflowLimiter.objects.filter(name__startswith="concurrency:slots-lane:").values_list("in_use", flat=True)
    ) == {0}
    assert not WorkflowStep.objects.filter(holds_slots=True).exists()
