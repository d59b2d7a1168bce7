"""A quick step's outcome is written when it ends, not held behind its worker's next body.

A worker batches the outcomes of steps that end together, but writes what it holds before
it starts a body not known to be quick (a step whose recent bodies all ended within
``BATCH_WINDOW``): a slow step never keeps an earlier step's run from moving on.
"""

import threading
import time

import pytest

from pgbus_workflows import Workflow, step
from pgbus_workflows.dispatcher import taking as taking_module
from pgbus_workflows.dispatcher import workers as workers_module
from pgbus_workflows.dispatcher.workers import WorkerPool
from pgbus_workflows.services.claims import claim_due_steps
from tests.procs import eventually

pytestmark = pytest.mark.django_db(transaction=True)

#: Set when the held body starts; the body ends once the test sets ``RELEASE``.
ENTERED, RELEASE = threading.Event(), threading.Event()


class Quick(Workflow):
    """One no-op step."""

    name = "flush_quick"
    allow_multiple = True

    @step
    def quick(self):
        return None


class Held(Workflow):
    """One step whose body runs until the test releases it (a slow call, under the test's control),
    or, with ``quick``, returns at once."""

    name = "flush_held"
    allow_multiple = True

    @step
    def held(self):
        if self.arguments.get("quick"):
            return
        ENTERED.set()
        RELEASE.wait(60)


@pytest.fixture
def pool_of():
    """A started pool of ``size`` workers, stopped (every claim finished) after the test."""
    started = []
    ENTERED.clear()
    RELEASE.clear()

    def make(size):
        stopping, lost = threading.Event(), threading.Event()
        pool = WorkerPool(name="w", queues=None, size=size, stopping=stopping, on_free=lambda: None, on_lost=lost.set)
        pool.start()
        started.append((pool, stopping, lost))
        return pool

    yield make
    RELEASE.set()
    for pool, stopping, lost in started:
        stopping.set()
        assert not pool.join(time.monotonic() + 30), "a worker did not finish"
        assert not lost.is_set()


def test_an_outcome_is_written_before_the_same_worker_starts_a_body_not_known_to_be_quick(pool_of):
    quick = Quick.start()
    held = Held.start()
    pool = pool_of(1)  # one worker: nobody else could write its batch
    claimed = claim_due_steps(10, claimed_by="w")
    assert [step.step_name for step in claimed] == ["quick", "held"]
    pool.hand_out(claimed, verify=True)

    eventually(ENTERED.is_set, what="the held body to start on the same worker")
    eventually(lambda: quick.reload().status == "finished", what="the quick run to finish while the body runs")
    assert held.reload().status == "performing"
    RELEASE.set()
    eventually(lambda: held.reload().status == "finished", what="the held run to finish")


def test_a_body_known_to_be_quick_that_runs_long_has_the_outcomes_before_it_written_by_an_idle_worker(
    pool_of, monkeypatch
):
    # A generous window: the idle worker leaves the lane's queued step alone while the quick body runs.
    monkeypatch.setattr(workers_module, "BATCH_WINDOW", 0.5)
    monkeypatch.setattr(taking_module, "BATCH_WINDOW", 0.5)
    pool = pool_of(2)
    warm = Held.start(quick=True)
    pool.hand_out(claim_due_steps(1, claimed_by="w"), verify=True)  # the pool learns the step is quick
    eventually(lambda: warm.reload().status == "finished", what="the warm-up run")

    quick = Quick.start()
    held = Held.start()
    claimed = claim_due_steps(10, claimed_by="w")
    assert [step.step_name for step in claimed] == ["quick", "held"]
    first = pool.taking.lanes[0]
    pool.hand_out(claimed, verify=False, lane=first)  # both on one worker's lane, in this order

    eventually(ENTERED.is_set, what="the held body to start")
    assert first.body_since is not None, "the held body runs on the worker that ran the quick step"
    eventually(lambda: quick.reload().status == "finished", what="the quick run to finish while the body runs")
    RELEASE.set()
    eventually(lambda: held.reload().status == "finished", what="the held run to finish")


def test_outcomes_of_quick_steps_that_end_together_are_still_written_together(pool_of, monkeypatch):
    # A generous window, so a loaded machine does not cut the batch short.
    monkeypatch.setattr(workers_module, "BATCH_WINDOW", 0.5)
    monkeypatch.setattr(taking_module, "BATCH_WINDOW", 0.5)
    batches = []
    real_apply = workers_module.apply_outcomes

    def counted(performed, chain):
        batches.append(len(performed))
        return real_apply(performed, chain)

    monkeypatch.setattr(workers_module, "apply_outcomes", counted)
    pool = pool_of(1)
    warm = Quick.start()
    pool.hand_out(claim_due_steps(1, claimed_by="w"), verify=True)  # the pool learns the step is quick
    eventually(lambda: warm.reload().status == "finished", what="the warm-up run")
    batches.clear()

    runs = Quick.start_many([{} for _ in range(5)])
    pool.hand_out(claim_due_steps(10, claimed_by="w"), verify=True)
    eventually(lambda: all(wf.reload().status == "finished" for wf in runs), what="the five runs")
    assert sum(batches) == 5 and len(batches) < 5, batches
