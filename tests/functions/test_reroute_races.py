"""Races with real threads: an operator's verb against a checkpoint's reroute, both under the run lock.

The function stops at a gate before its checkpoint (``queue="slow"`` and a concurrency key:
rerouted from the default queue's row); the test takes the run lock with a verb, lets the
function go on to the reroute, which waits for the lock, then commits the verb.
"""

import threading

import pytest
from django.db import transaction

from pgbus_workflows import Concurrency, durable
from pgbus_workflows.conf import settings
from pgbus_workflows.models import WorkflowLimiter
from pgbus_workflows.services import operator
from pgbus_workflows.services.executor import run_due_steps
from pgbus_workflows.states import RunStatus, StepStatus
from tests.procs import eventually
from tests.support import events_of, labels, record, sessions_waiting_for_a_lock, steps_of
from tests.threads import JOIN_TIMEOUT, Worker

pytestmark = pytest.mark.django_db(transaction=True)

ENTERED = threading.Event()
RELEASE = threading.Event()
#: Set once the gate was passed: the function's replays do not stop there again.
PASSED: list[bool] = []


@pytest.fixture(autouse=True)
def _reset_gates():
    ENTERED.clear()
    RELEASE.clear()
    PASSED.clear()
    yield
    RELEASE.set()  # never leave a function blocked


@durable(name="durable_raced_reroute", allow_multiple=True)
def raced(ctx):
    if not PASSED:  # code between checkpoints: here the test takes the run lock
        PASSED.append(True)
        ENTERED.set()
        assert RELEASE.wait(JOIN_TIMEOUT), "the test never released the function"

    def body():
        record("there")
        return "there"

    return ctx.step("there", body, queue="slow", concurrency=Concurrency(key="raced-key", limit=1))


def race_with(verb, run):
    """Run the function to its gate, then ``verb`` the run while the reroute waits for its lock."""
    worker = Worker(run_due_steps, 10, [settings.DEFAULT_QUEUE])
    worker.start()
    assert ENTERED.wait(JOIN_TIMEOUT)
    with transaction.atomic():
        verb(run.record.pk, reason="race")
        RELEASE.set()
        waiting = Worker(eventually, lambda: sessions_waiting_for_a_lock("FOR UPDATE"), 30, 0.05, "the reroute")
        waiting.start()
        waiting.finish()
    worker.finish()


def slots_held():
    return sum(WorkflowLimiter.objects.filter(name="concurrency:raced-key").values_list("in_use", flat=True))


def test_a_cancel_that_took_the_lock_first_leaves_nothing_to_reroute():
    run = raced.start(None)
    race_with(operator.cancel, run)
    assert run.reload().status == RunStatus.CANCELLED
    assert not events_of(run, "step_rerouted")
    assert [s.status for s in steps_of(run)] == [StepStatus.CANCELLED]  # the entry row
    assert labels() == []
    assert slots_held() == 0


def test_a_pause_that_took_the_lock_first_holds_the_rerouted_checkpoint_until_resumed():
    run = raced.start(None)
    race_with(operator.pause, run)
    assert run.reload().status == RunStatus.PAUSED
    (there,) = steps_of(run)
    assert (there.step_name, there.status, there.queue, there.held) == ("there", StepStatus.SCHEDULED, "slow", True)
    assert len(events_of(run, "step_rerouted")) == 1
    assert run_due_steps(queues=["slow"]) == 0  # held while paused
    operator.resume(run.record.pk)
    run_due_steps(queues=["slow"])
    assert run.reload().status == RunStatus.FINISHED
    assert labels() == ["there"]
    assert slots_held() == 0
