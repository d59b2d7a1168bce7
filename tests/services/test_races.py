"""Races with real threads against PostgreSQL.

Each thread has its own database connection (Django's are per thread) and closes it when it
ends. Interleavings are forced with ``threading.Event`` / ``Barrier``; a short sleep is only
used to give a call the time to block, never to decide an outcome.
"""

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest

from pgbus_workflows import InvalidTransition, Workflow, step
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step, run_due_steps
from pgbus_workflows.states import ONGOING_RUN
from tests.procs import eventually
from tests.support import kinds, sessions_waiting_for_a_lock, steps_of
from tests.testapp.models import Receipt, SideEffect
from tests.threads import JOIN_TIMEOUT, Worker

pytestmark = pytest.mark.django_db(transaction=True)

#: A verb that takes no lock held by a step body returns well within this.

#: Set by a gated body once it runs; the body then blocks until RELEASE is set.
ENTERED = threading.Event()
RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def _reset_gates():
    ENTERED.clear()
    RELEASE.clear()
    yield
    RELEASE.set()  # never leave a body blocked


def claim_and_execute(queue):
    claimed = claim_due_steps(1, queues=[queue])
    assert len(claimed) == 1
    return execute_step(claimed[0])


def gate(label):
    """Inside a body: say we are in, wait to be released, then record the side effect."""
    ENTERED.set()
    assert RELEASE.wait(JOIN_TIMEOUT), "the test never released the body"
    SideEffect.objects.create(label=label)


# -- (1) two claimers on one queue ---------------------------------------------------------------

CLAIM_QUEUE = "race_claim_q"


class RaceClaim(Workflow):
    name = "race_claim"
    allow_multiple = True
    step_options = {"queue": CLAIM_QUEUE}

    @step
    def one(self):
        SideEffect.objects.create(label="one", key=f"{self.record.workflow_id}:{self.attempt}")

    @step
    def two(self):
        SideEffect.objects.create(label="two", key=f"{self.record.workflow_id}:{self.attempt}")


def drain(barrier):
    """Claim and run one due step at a time until every race_claim run is over."""
    barrier.wait(JOIN_TIMEOUT)
    ran = 0
    deadline = time.monotonic() + JOIN_TIMEOUT
    while time.monotonic() < deadline:
        done = run_due_steps(limit=1, queues=[CLAIM_QUEUE], claimed_by=threading.current_thread().name)
        ran += done
        if not done and not WorkflowRun.objects.filter(workflow_class="race_claim", status__in=ONGOING_RUN).exists():
            return ran
    raise AssertionError("runs still ongoing at the deadline")


def test_two_claimers_run_every_attempt_exactly_once(order):
    runs = [RaceClaim.start(order, n=n) for n in range(20)]
    barrier = threading.Barrier(2)
    workers = [Worker(drain, barrier) for _ in range(2)]
    for worker in workers:
        worker.start()
    ran = [worker.finish() for worker in workers]

    assert sum(ran) == 40
    executions = Counter(SideEffect.objects.values_list("label", "key"))
    expected = {(label, f"{wf.workflow_id}:1") for wf in runs for label in ("one", "two")}
    assert set(executions) == expected
    assert set(executions.values()) == {1}
    for wf in runs:
        assert wf.reload().status == "finished"
        assert [(s.step_name, s.attempt, s.status) for s in steps_of(wf)] == [
            ("one", 1, "completed"),
            ("two", 1, "completed"),
        ]
        assert kinds(wf).count("step_started") == 2
    assert not WorkflowEvent.objects.filter(kind="outcome_discarded").exists()


# -- (2) a pause while a body runs ---------------------------------------------------------------

PAUSE_QUEUE = "race_pause_q"


class RacePauseGate(Workflow):
    name = "race_pause_gate"
    step_options = {"queue": PAUSE_QUEUE}

    @step
    def slow(self):
        gate("slow")
        return {"done": True}

    @step
    def after(self):
        SideEffect.objects.create(label="after")


def test_pause_during_a_running_body_keeps_its_outcome_and_holds(order):
    wf = RacePauseGate.start(order)
    worker = Worker(claim_and_execute, PAUSE_QUEUE)
    worker.start()
    assert ENTERED.wait(JOIN_TIMEOUT)

    # The body waits for RELEASE: a pause that waited for it would never end, so it runs on a
    # thread of its own that must end while the body still waits.
    pausing = Worker(lambda: wf.pause(actor="alice", reason="look first"))
    pausing.start()
    pausing.finish()
    assert worker.is_alive()
    assert wf.reload().status == "paused"
    assert WorkflowStep.objects.get(run_id=wf.record.pk, step_name="slow").status == "in_progress"

    RELEASE.set()
    outcome = worker.finish()

    assert outcome.kind == "success"
    wf.reload()
    assert (wf.status, wf.current_step) == ("paused", "after")
    assert [(s.step_name, s.status, s.held, s.output) for s in steps_of(wf)] == [
        ("slow", "completed", False, {"done": True}),
        ("after", "scheduled", True, None),  # held: out of every claim's way until the resume
    ]
    events = list(wf.events)
    paused = next(e for e in events if e.kind == "paused")
    hold = events[-1]
    assert (paused.transition, paused.from_status, paused.actor) == ("pause", "performing", "alice")
    assert (hold.kind, hold.transition, hold.from_status, hold.to_status) == (
        "step_completed",
        "hold",
        "paused",
        "paused",
    )
    assert paused.pk < hold.pk
    assert claim_due_steps(10, queues=[PAUSE_QUEUE]) == []

    wf.resume(actor="alice")
    assert run_due_steps(queues=[PAUSE_QUEUE]) == 1
    assert wf.reload().status == "finished"
    assert sorted(SideEffect.objects.values_list("label", flat=True)) == ["after", "slow"]


# -- (3) a cancel while a body runs --------------------------------------------------------------

CANCEL_QUEUE = "race_cancel_q"


class RaceCancelGate(Workflow):
    name = "race_cancel_gate"
    step_options = {"queue": CANCEL_QUEUE}

    @step
    def slow(self):
        gate("slow")
        return {"done": True}

    @step
    def after(self):
        SideEffect.objects.create(label="after")


def test_cancel_during_a_running_body_discards_its_outcome(order):
    wf = RaceCancelGate.start(order)
    worker = Worker(claim_and_execute, CANCEL_QUEUE)
    worker.start()
    assert ENTERED.wait(JOIN_TIMEOUT)

    cancelling = Worker(lambda: wf.cancel(actor="bob", reason="customer asked"))  # while the body waits
    cancelling.start()
    cancelling.finish()
    assert worker.is_alive()
    assert wf.reload().status == "cancelled"
    (active,) = steps_of(wf)
    assert (active.status, active.outcome) == ("cancelled", "cancelled")

    RELEASE.set()
    worker.finish()

    wf.reload()
    assert wf.status == "cancelled"
    (row,) = steps_of(wf)
    assert (row.step_name, row.status, row.outcome, row.output) == ("slow", "cancelled", "cancelled", None)
    discarded = wf.events.get(kind="outcome_discarded")
    assert discarded.details["outcome"] == "success"
    assert discarded.details["step_status"] == "cancelled"
    cancelled = wf.events.get(kind="cancelled")
    assert (cancelled.actor, cancelled.reason, cancelled.from_status) == ("bob", "customer asked", "performing")
    assert cancelled.pk < discarded.pk
    assert run_due_steps(queues=[CANCEL_QUEUE]) == 0
    assert list(SideEffect.objects.values_list("label", flat=True)) == ["slow"]


# -- (4) a pause while an atomic body runs -------------------------------------------------------

ATOMIC_QUEUE = "race_atomic_q"


class RaceAtomicGate(Workflow):
    name = "race_atomic_gate"
    step_options = {"queue": ATOMIC_QUEUE}

    @step(atomic=True)
    def write_receipt(self):
        ENTERED.set()
        assert RELEASE.wait(JOIN_TIMEOUT), "the test never released the body"
        Receipt.objects.create(order=self.subject, note="atomic")
        return {"receipt": True}

    @step(wait=timedelta(hours=1))
    def later(self):
        SideEffect.objects.create(label="later")


def test_pause_waits_for_an_atomic_body_to_commit(order):
    wf = RaceAtomicGate.start(order)
    worker = Worker(claim_and_execute, ATOMIC_QUEUE)
    worker.start()
    assert ENTERED.wait(JOIN_TIMEOUT)

    pauser = Worker(lambda: RaceAtomicGate.find(wf.workflow_id).pause(actor="alice", reason="wait"))
    pauser.start()
    # pause() waits for the run's lock, which the atomic body's transaction holds.
    eventually(sessions_waiting_for_a_lock, what="pause() waiting for the run's lock")
    assert pauser.is_alive(), "pause returned while the atomic body still held the run"
    assert WorkflowRun.objects.get(pk=wf.record.pk).status == "performing"
    assert not Receipt.objects.exists()

    RELEASE.set()
    worker.finish()
    pauser.finish()

    wf.reload()
    assert wf.status == "paused"
    assert Receipt.objects.filter(order=order, note="atomic").count() == 1
    assert [(s.step_name, s.status, s.output) for s in steps_of(wf)] == [
        ("write_receipt", "completed", {"receipt": True}),
        ("later", "scheduled", None),
    ]
    completed = wf.events.get(kind="step_completed")
    paused = wf.events.get(kind="paused")
    assert (completed.transition, completed.from_status, completed.to_status) == ("advance", "performing", "ready")
    assert (paused.transition, paused.from_status, paused.actor) == ("pause", "ready", "alice")
    assert completed.pk < paused.pk

    wf.resume(actor="alice")
    wf.run_now(actor="alice")
    assert run_due_steps(queues=[ATOMIC_QUEUE]) == 1
    assert wf.reload().status == "finished"
    assert Receipt.objects.count() == 1


# -- (5) two operators pause at once -------------------------------------------------------------


class RaceTwoPausers(Workflow):
    name = "race_two_pausers"
    allow_multiple = True
    step_options = {"queue": "race_two_pausers_q"}

    @step(wait=timedelta(hours=1))
    def later(self):
        SideEffect.objects.create(label="later")


def pause_at_once(workflow_id, barrier, actor):
    handle = RaceTwoPausers.find(workflow_id)
    barrier.wait(JOIN_TIMEOUT)
    handle.pause(actor=actor, reason="mine")
    return actor


def test_two_operators_pause_at_once_exactly_one_wins(order):
    for _ in range(5):
        wf = RaceTwoPausers.start(order)
        barrier = threading.Barrier(2)
        pausers = [Worker(pause_at_once, wf.workflow_id, barrier, actor) for actor in ("alice", "bob")]
        for pauser in pausers:
            pauser.start()
        for pauser in pausers:
            pauser.join(JOIN_TIMEOUT)
            assert not pauser.is_alive()

        winners = [p.result for p in pausers if p.error is None]
        losers = [p.error for p in pausers if p.error is not None]
        assert len(winners) == 1
        assert len(losers) == 1
        assert isinstance(losers[0], InvalidTransition)
        assert "Cannot pause a paused workflow" in str(losers[0])
        wf.reload()
        assert wf.status == "paused"
        (paused,) = wf.events.filter(kind="paused")
        assert (paused.actor, paused.from_status) == (winners[0], "ready")
        assert [s.status for s in steps_of(wf)] == ["scheduled"]
