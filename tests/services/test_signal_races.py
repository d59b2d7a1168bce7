"""Signal races with real threads against PostgreSQL (issue 4).

Each thread has its own database connection and closes it in a ``finally``. Interleavings
are forced with ``threading.Event`` / ``Barrier``; nothing relies on a sleep for its outcome.
"""

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from pgbus_workflows import Workflow, step
from pgbus_workflows.models import WorkflowRun, WorkflowSignal
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step, run_due_steps
from pgbus_workflows.services.signals import deliver_signal
from pgbus_workflows.services.timeouts import expire_due_waits
from tests.support import kinds, record, steps_of
from tests.testapp.models import Order, SideEffect
from tests.threads import JOIN_TIMEOUT, Worker

pytestmark = pytest.mark.django_db(transaction=True)

RQ = "sig_race_q"

ENTERED = threading.Event()
RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def _reset_gates():
    ENTERED.clear()
    RELEASE.clear()
    yield
    RELEASE.set()  # never leave a body blocked


def signal_info(workflow) -> dict:
    received = workflow.received_signal
    return {"timed_out": workflow.timed_out, "signal": None if received is None else received.pk}


class SigRaceBefore(Workflow):
    """The previous step is still running when the signal arrives."""

    name = "sig_race_before"
    step_options = {"queue": RQ}

    @step
    def slow(self):
        ENTERED.set()
        assert RELEASE.wait(JOIN_TIMEOUT), "the test never released the body"
        record("slow")

    @step(wait_for="paid")
    def capture(self):
        record("capture", str(self.record.workflow_id))
        return signal_info(self)


class SigRaceGate(Workflow):
    name = "sig_race_gate"
    step_options = {"queue": RQ}

    @step(wait_for="go")
    def capture(self):
        record("capture", str(self.record.workflow_id))
        return signal_info(self)


class SigRaceTimeoutPause(Workflow):
    name = "sig_race_timeout_pause"
    step_options = {"queue": RQ}

    @step(wait_for="paid", wait_timeout=timedelta(hours=1))
    def capture(self):
        record("capture")


class SigRaceTimeoutRun(Workflow):
    name = "sig_race_timeout_run"
    step_options = {"queue": RQ}

    @step(wait_for="paid", wait_timeout=timedelta(hours=1), on_timeout="run")
    def capture(self):
        record("capture")


def park(cls):
    """A fresh run of ``cls`` (about a new order) parked on its first step."""
    wf = cls.start(Order.objects.create())
    (claimed,) = claim_due_steps(1, queues=[RQ])
    assert execute_step(claimed) is None
    assert wf.reload().status == "waiting"
    return wf


# -- a signal while the previous step runs ----------------------------------------------------------


def test_a_signal_during_the_previous_step_is_consumed_when_the_wait_for_step_comes_up(order):
    wf = SigRaceBefore.start(order)

    def run_slow():
        (claimed,) = claim_due_steps(1, queues=[RQ])
        return execute_step(claimed)

    worker = Worker(run_slow)
    worker.start()
    assert ENTERED.wait(JOIN_TIMEOUT)

    signal = wf.signal("paid", {"amount": 42}, "evt_1", actor="stripe")

    assert worker.is_alive()
    assert wf.status == "performing"
    signal.refresh_from_db()
    assert (signal.status, signal.consumed_by_id) == ("pending", None)
    (slow,) = steps_of(wf)
    assert slow.status == "in_progress"

    RELEASE.set()
    assert worker.finish().kind == "success"
    assert wf.reload().status == "ready"
    assert run_due_steps(queues=[RQ]) == 1

    wf.reload()
    assert wf.status == "finished"
    slow, capture = steps_of(wf)
    assert (slow.status, capture.status) == ("completed", "completed")
    signal.refresh_from_db()
    assert (signal.status, signal.consumed_by_id) == ("consumed", capture.pk)
    assert capture.output == {"timed_out": False, "signal": signal.pk}
    assert "step_waiting" not in kinds(wf)
    assert sorted(SideEffect.objects.values_list("label", flat=True)) == ["capture", "slow"]


# -- a signal racing the gate of its step -------------------------------------------------------------


def test_a_signal_racing_the_gate_is_never_lost():
    """Round after round, the gate and the delivery meet at a barrier: whichever locks the run first."""
    paths = Counter()
    for _ in range(20):
        wf = SigRaceGate.start(Order.objects.create())
        (claimed,) = claim_due_steps(1, queues=[RQ])
        barrier = threading.Barrier(2)

        def gate(claimed=claimed, barrier=barrier):
            barrier.wait(JOIN_TIMEOUT)
            return execute_step(claimed)

        def deliver(run_pk=wf.record.pk, barrier=barrier):
            barrier.wait(JOIN_TIMEOUT)
            return deliver_signal(run_pk, "go", {"n": 1})

        workers = [Worker(gate), Worker(deliver)]
        for worker in workers:
            worker.start()
        outcome, signal = (worker.finish() for worker in workers)
        paths["consumed at the gate" if outcome is not None else "parked then woken"] += 1
        run_due_steps(queues=[RQ])

        wf.reload()
        assert wf.status == "finished"
        (capture,) = steps_of(wf)
        assert (capture.step_name, capture.attempt, capture.status) == ("capture", 1, "completed")
        signal.refresh_from_db()
        assert (signal.status, signal.consumed_by_id) == ("consumed", capture.pk)
        assert capture.output == {"timed_out": False, "signal": signal.pk}
        assert SideEffect.objects.filter(label="capture", key=str(wf.workflow_id)).count() == 1
        assert kinds(wf).count("signal_consumed") == 1
    assert sum(paths.values()) == 20


# -- two deliveries with one idempotency key ----------------------------------------------------------


def test_two_concurrent_deliveries_with_one_key_store_one_signal():
    for _ in range(10):
        wf = park(SigRaceTimeoutRun)
        barrier = threading.Barrier(2)

        def deliver(n, run_pk=wf.record.pk, barrier=barrier):
            barrier.wait(JOIN_TIMEOUT)
            return deliver_signal(run_pk, "paid", {"n": n}, "evt_same", actor=f"hook{n}")

        workers = [Worker(deliver, n) for n in (1, 2)]
        for worker in workers:
            worker.start()
        results = [worker.finish() for worker in workers]

        assert sorted(r.duplicate_delivery for r in results) == [False, True]
        assert results[0].pk == results[1].pk
        (row,) = WorkflowSignal.objects.filter(run_id=wf.record.pk)
        first = next(r for r in results if not r.duplicate_delivery)
        assert (row.payload, row.actor, row.status) == (first.payload, first.actor, "consumed")
        (capture,) = steps_of(wf)
        assert (capture.status, capture.signal_id) == ("scheduled", row.pk)
        events = kinds(wf)
        assert (events.count("signal_received"), events.count("signal_consumed"), events.count("step_woken")) == (
            1,
            1,
            1,
        )
        assert wf.reload().status == "ready"
        wf.cancel()


def test_two_concurrent_signals_wake_the_step_once_and_the_other_stays_pending():
    wf = park(SigRaceTimeoutRun)
    barrier = threading.Barrier(2)

    def deliver(key):
        barrier.wait(JOIN_TIMEOUT)
        return deliver_signal(wf.record.pk, "paid", None, key)

    workers = [Worker(deliver, key) for key in ("evt_a", "evt_b")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.finish()

    statuses = Counter(WorkflowSignal.objects.filter(run_id=wf.record.pk).values_list("status", flat=True))
    assert statuses == Counter({"consumed": 1, "pending": 1})
    (capture,) = steps_of(wf)
    consumed = WorkflowSignal.objects.get(run_id=wf.record.pk, status="consumed")
    assert (capture.status, capture.signal_id, consumed.consumed_by_id) == ("scheduled", consumed.pk, capture.pk)
    assert kinds(wf).count("step_woken") == 1


# -- a timeout firing while a signal commits ------------------------------------------------------------


@pytest.mark.parametrize("cls", [SigRaceTimeoutPause, SigRaceTimeoutRun], ids=["pause", "run"])
def test_a_timeout_racing_a_signal_has_exactly_one_winner(cls):
    winners = Counter()
    for _ in range(20):
        wf = park(cls)
        run_pk = wf.record.pk
        barrier = threading.Barrier(2)
        later = timezone.now() + timedelta(hours=2)

        def deliver(run_pk=run_pk, barrier=barrier):
            barrier.wait(JOIN_TIMEOUT)
            return deliver_signal(run_pk, "paid", {"late": True})

        def expire(barrier=barrier, later=later):
            barrier.wait(JOIN_TIMEOUT)
            return expire_due_waits(later)

        workers = [Worker(deliver), Worker(expire)]
        for worker in workers:
            worker.start()
        signal, fired = (worker.finish() for worker in workers)

        signal.refresh_from_db()
        (capture,) = steps_of(wf)
        run = WorkflowRun.objects.get(pk=run_pk)
        events = kinds(wf)
        assert events.count("signal_received") == 1
        assert fired in (0, 1)
        if fired:
            winners["timeout"] += 1
            assert events.count("wait_timed_out") == 1
            assert "step_woken" not in events
            assert (signal.status, signal.consumed_by_id) == ("pending", None)
            assert (capture.signal_id, capture.timed_out) == (None, True)
            if cls is SigRaceTimeoutPause:
                assert (capture.status, run.status) == ("failed", "paused")
                assert capture.error_class.endswith("WaitTimedOut")
            else:
                assert (capture.status, run.status) == ("scheduled", "ready")
        else:
            winners["signal"] += 1
            assert "wait_timed_out" not in events
            assert events.count("step_woken") == 1
            assert (signal.status, signal.consumed_by_id) == ("consumed", capture.pk)
            assert (capture.status, capture.signal_id, capture.timed_out) == ("scheduled", signal.pk, False)
            assert run.status == "ready"
        wf.cancel()  # leaves no waiting step for the next round's sweep
    assert sum(winners.values()) == 20


# -- the webhook's own transaction ------------------------------------------------------------------------


class WebhookRolledBack(Exception):
    pass


def webhook(run_pk, in_transaction, finish, commit):
    """Record the webhook's own row and signal the run in one transaction; wait; commit or roll back."""
    try:
        with transaction.atomic():
            SideEffect.objects.create(label="webhook")
            signal = deliver_signal(run_pk, "paid", {"amount": 3}, "evt_hook", actor="webhook")
            in_transaction.set()
            assert finish.wait(JOIN_TIMEOUT)
            if not commit:
                raise WebhookRolledBack
            return signal
    except WebhookRolledBack:
        return None


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_a_webhook_transaction_moves_the_run_only_when_it_commits(commit):
    wf = park(SigRaceTimeoutPause)
    run_pk = wf.record.pk
    in_transaction, finish = threading.Event(), threading.Event()
    hook = Worker(webhook, run_pk, in_transaction, finish, commit)
    hook.start()
    assert in_transaction.wait(JOIN_TIMEOUT)

    # another connection sees nothing of the open transaction, and claims nothing
    assert WorkflowSignal.objects.filter(run_id=run_pk).count() == 0
    assert WorkflowRun.objects.get(pk=run_pk).status == "waiting"
    assert steps_of(wf)[0].status == "waiting"
    assert claim_due_steps(10, queues=[RQ]) == []

    # a retry of the webhook from another connection waits for the first one's outcome
    retry = Worker(deliver_signal, run_pk, "paid", {"amount": 3}, "evt_hook", "retry")
    retry.start()
    finish.set()
    result = hook.finish()
    again = retry.finish()

    (signal,) = WorkflowSignal.objects.filter(run_id=run_pk)
    (capture,) = steps_of(wf)
    if commit:
        assert result.pk == signal.pk
        assert again.duplicate_delivery is True
        assert again.pk == signal.pk
        assert signal.actor == "webhook"
        assert list(SideEffect.objects.values_list("label", flat=True)) == ["webhook"]
    else:
        assert result is None
        assert again.duplicate_delivery is False  # the first delivery never happened
        assert signal.actor == "retry"
        assert not SideEffect.objects.filter(label="webhook").exists()
    assert (signal.status, signal.consumed_by_id) == ("consumed", capture.pk)
    assert (capture.status, capture.signal_id) == ("scheduled", signal.pk)
    assert kinds(wf).count("signal_received") == 1
    assert run_due_steps(queues=[RQ]) == 1
    assert wf.reload().status == "finished"


def test_a_rolled_back_webhook_leaves_no_signal():
    wf = park(SigRaceTimeoutPause)
    run_pk = wf.record.pk
    events_before = kinds(wf)
    in_transaction, finish = threading.Event(), threading.Event()
    hook = Worker(webhook, run_pk, in_transaction, finish, False)
    hook.start()
    assert in_transaction.wait(JOIN_TIMEOUT)
    finish.set()
    assert hook.finish() is None

    assert WorkflowSignal.objects.filter(run_id=run_pk).count() == 0
    assert WorkflowRun.objects.get(pk=run_pk).status == "waiting"
    (capture,) = steps_of(wf)
    assert (capture.status, capture.signal_id) == ("waiting", None)
    assert kinds(wf) == events_before
    assert not SideEffect.objects.exists()
    assert claim_due_steps(10, queues=[RQ]) == []
