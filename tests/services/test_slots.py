"""Concurrency slots beyond the claim and the outcome: a cancelled body keeps its slot, the sweep repairs leaks."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.urls import reverse

from pgbus_workflows import Concurrency, Workflow, step
from pgbus_workflows.conf import settings
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.dispatcher.workers import WorkerPool
from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowLimiter, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.slot_sweep import give_back_stalled, reconcile
from pgbus_workflows.services.stuck import gauge
from pgbus_workflows.sql import clock
from tests.procs import eventually
from tests.support import scheduled
from tests.testapp.limited_workflows import KeyedGate
from tests.testapp.models import SideEffect
from tests.threads import Worker

QUEUE = "slots_account"


class SlotSync(Workflow):
    """One step per account at a time; a second step to resume at."""

    name = "slots_sync"
    allow_multiple = True
    step_options = {"queue": QUEUE}
    concurrency = Concurrency(key=lambda wf: f"slots:{wf.arguments['account']}", limit=1)

    @step
    def push(self):
        return None

    @step
    def confirm(self):
        return None


class PairSync(Workflow):
    """Two steps of an account at a time (the race's key: a leaked slot leaves room for a claim)."""

    name = "slots_pair"
    allow_multiple = True
    step_options = {"queue": "slots_pair"}
    concurrency = Concurrency(key=lambda wf: f"pair:{wf.arguments['account']}", limit=2)

    @step
    def push(self):
        return None


class GuardedSync(Workflow):
    """A step that waits for a signal and an atomic one, under one key per account."""

    name = "slots_guarded"
    allow_multiple = True
    step_options = {"queue": "slots_guarded"}
    concurrency = Concurrency(key=lambda wf: f"guarded:{wf.arguments['account']}", limit=1)

    @step(wait_for="ack")
    def acknowledged(self):
        return None

    @step(atomic=True)
    def booked(self):
        return None


def _claim(queue: str = QUEUE) -> list[WorkflowStep]:
    return claim_due_steps(10, queues=[queue], claimed_by="slots-dispatcher")


def _in_use(name: str) -> int:
    return WorkflowLimiter.objects.get(name=name).in_use


def _alive(name: str = "slots-dispatcher") -> None:
    Dispatcher.objects.create(name=name, hostname="test", pid=1, heartbeat_at=clock.now())


# -- a cancelled attempt keeps its slot while its body runs -------------------------------------------


@pytest.mark.django_db
def test_a_cancelled_running_attempt_keeps_its_slot_until_its_body_returns():
    first, second = SlotSync.start(account=1), SlotSync.start(account=1)
    [claimed] = _claim()

    first.cancel(reason="test")

    assert WorkflowStep.objects.get(pk=claimed.pk).holds_slots
    assert _in_use("concurrency:slots:1") == 1
    assert _claim() == []  # the body still runs: the next run of the key waits

    execute_step(claimed, verify=False)  # the body runs and returns; its outcome is discarded

    assert WorkflowEvent.objects.filter(run=first.record, kind="outcome_discarded").exists()
    assert not WorkflowStep.objects.get(pk=claimed.pk).holds_slots
    assert _in_use("concurrency:slots:1") == 0
    [following] = _claim()
    assert following.run_id == second.record.pk


@pytest.mark.django_db
def test_an_attempt_cancelled_before_its_body_ran_gives_its_slot_back_when_its_dispatcher_finds_it():
    first = SlotSync.start(account=2)
    [claimed] = _claim()
    first.cancel()

    assert execute_step(claimed) is None  # re-checked before the body: it never runs

    assert _in_use("concurrency:slots:2") == 0
    assert not WorkflowStep.objects.get(pk=claimed.pk).holds_slots


@pytest.mark.django_db
@pytest.mark.parametrize("first_step", ["acknowledged", "booked"])
def test_a_wait_for_or_atomic_step_cancelled_before_its_body_ran_gives_its_slot_back(first_step):
    wf = GuardedSync.start(account=first_step)
    if first_step == "booked":
        wf.pause()
        wf.resume_at("booked")
    [claimed] = _claim("slots_guarded")
    wf.cancel()

    assert execute_step(claimed, verify=False) is None  # the signal's gate, the atomic unit: it never runs

    assert _in_use(f"concurrency:guarded:{first_step}") == 0


@pytest.mark.django_db
def test_resume_at_of_a_running_step_keeps_the_slot_until_the_cancelled_body_returns():
    wf = SlotSync.start(account=3)
    [claimed] = _claim()
    wf.pause()
    wf.resume_at("confirm")

    assert _in_use("concurrency:slots:3") == 1
    assert _claim() == []  # confirm is due, but push's body still runs

    execute_step(claimed, verify=False)
    [confirm] = _claim()
    assert confirm.step_name == "confirm"


@pytest.mark.django_db
def test_a_cancelled_attempt_that_stalls_gives_its_slot_back():
    _alive()
    wf = SlotSync.start(account=4)
    [claimed] = _claim()
    wf.cancel()

    assert give_back_stalled(clock.now()) == 0  # its dispatcher lives and it is not past its stall_at
    assert _in_use("concurrency:slots:4") == 1

    WorkflowStep.objects.filter(pk=claimed.pk).update(stall_at=clock.now() - timedelta(seconds=1))
    assert Sweeper().run(clock.now())["cancelled_slots"] == 1

    assert _in_use("concurrency:slots:4") == 0
    assert not WorkflowStep.objects.get(pk=claimed.pk).holds_slots
    execute_step(claimed, verify=False)  # the body that stopped answering returns at last
    assert _in_use("concurrency:slots:4") == 0  # given back once, not twice


@pytest.mark.django_db
def test_a_cancelled_attempt_whose_dispatcher_is_gone_gives_its_slot_back():
    wf = SlotSync.start(account=5)
    assert len(_claim()) == 1
    wf.cancel()

    assert give_back_stalled(clock.now()) == 1  # no dispatcher named slots-dispatcher heartbeats

    assert _in_use("concurrency:slots:5") == 0


# -- the sweep repairs leaked slots ---------------------------------------------------------------------


@pytest.mark.django_db
def test_reconcile_repairs_slots_leaked_by_rows_deleted_outside_the_library_and_leaves_right_counts_alone(caplog):
    _alive()
    SlotSync.start(account=6)
    SlotSync.start(account=7)
    cancelled = SlotSync.start(account=8)
    claimed = {step.run.arguments["account"]: step for step in _claim()}
    cancelled.cancel()  # its body runs on: it holds its slot
    WorkflowRun.objects.filter(pk=claimed[6].run_id).delete()  # outside the library: the slot stays taken

    assert [_in_use(f"concurrency:slots:{n}") for n in (6, 7, 8)] == [1, 1, 1]
    assert Sweeper().run(clock.now())["limiter_slots"] == 1

    assert [_in_use(f"concurrency:slots:{n}") for n in (6, 7, 8)] == [0, 1, 1]
    assert WorkflowLimiter.objects.get(name="concurrency:slots:6").repaired_at is not None
    assert WorkflowLimiter.objects.get(name="concurrency:slots:7").repaired_at is None  # in progress: right
    assert WorkflowLimiter.objects.get(name="concurrency:slots:8").repaired_at is None  # the cancelled body's
    assert "Limiter concurrency:slots:6 counted 1 slot(s) in use, but 0 attempt(s) hold one: repaired" in caplog.text
    assert reconcile(clock.now()) == 0


@pytest.mark.django_db(transaction=True)
def test_reconcile_never_takes_a_slot_from_an_attempt_whose_claim_has_not_committed():
    PairSync.start(account=1)
    [leaked] = _claim("slots_pair")
    WorkflowRun.objects.filter(pk=leaked.run_id).delete()  # one slot of two leaked
    PairSync.start(account=1)
    claimed, go = threading.Event(), threading.Event()

    def claim_and_hold():
        with transaction.atomic():
            found = _claim("slots_pair")
            claimed.set()
            assert go.wait(30), "the test never let the claim commit"
        return found

    worker = Worker(claim_and_hold)
    worker.start()
    assert claimed.wait(30)

    # The claim holds the limiter's row, its slot taken and its attempt in progress, uncommitted.
    assert reconcile(clock.now()) == 0
    assert _in_use("concurrency:pair:1") == 1

    go.set()
    assert len(worker.finish()) == 1
    assert _in_use("concurrency:pair:1") == 2
    assert reconcile(clock.now()) == 1  # the leaked slot alone
    assert _in_use("concurrency:pair:1") == 1
    assert WorkflowStep.objects.filter(run__workflow_class=PairSync.name, status="in_progress").count() == 1


# -- the stuck gauge ---------------------------------------------------------------------------------------


def _overdue(klass: str) -> int:
    rows = gauge(clock.now())["stuck"]
    return next(row["count"] for row in rows if row["workflow_class"] == klass and row["reason"] == "overdue")


@pytest.mark.django_db
def test_the_stuck_gauge_leaves_steps_held_back_by_a_limit_out_of_overdue():
    SlotSync.start(account=9)
    held = SlotSync.start(account=9)
    assert len(_claim()) == 1  # account 9's first run: its slot is taken
    free = SlotSync.start(account=10)
    long_ago = clock.now() - settings.STALL_THRESHOLD - timedelta(minutes=1)
    WorkflowStep.objects.filter(pk__in=[scheduled(held).pk, scheduled(free).pk]).update(scheduled_at=long_ago)

    # Both due for over the stall threshold: account 10's has room and nothing claimed it
    # (stuck); account 9's waits for the slot its key's running step holds (not stuck).
    assert _overdue(SlotSync.name) == 1
    for parked in (True, False):  # its limiters read through either partial index, parked by a claim or not
        parked_on = "concurrency:slots:9" if parked else ""
        WorkflowStep.objects.filter(pk=scheduled(held).pk).update(parked=parked, parked_on=parked_on)
        assert _overdue(SlotSync.name) == 1


# -- a key function changed in a deploy -----------------------------------------------------------------


@pytest.mark.django_db
def test_a_changed_key_function_applies_to_steps_scheduled_after_it_so_old_and_new_keys_run_together(monkeypatch):
    before = SlotSync.start(account=11)
    waiting = SlotSync.start(account=11)
    [running] = _claim()
    assert running.run_id == before.record.pk

    # The deploy: the same account, a new key string.
    monkeypatch.setattr(SlotSync, "concurrency", Concurrency(key=lambda wf: f"v2:{wf.arguments['account']}", limit=1))
    after = SlotSync.start(account=11)

    [claimed] = _claim()  # under the new key: beside the old key's step, two steps of account 11 run
    assert claimed.run_id == after.record.pk
    assert WorkflowStep.objects.filter(run__workflow_class=SlotSync.name, status="in_progress").count() == 2
    # A step scheduled before the deploy keeps the key it was scheduled under until it ends.
    assert scheduled(waiting).limiters == ["concurrency:slots:11"]

    execute_step(running)  # the old key's step ends: its run's next step is scheduled under the new key
    assert scheduled(before).limiters == ["concurrency:v2:11"]
    [old_key] = _claim()
    assert old_key.run_id == waiting.record.pk


@pytest.mark.django_db(transaction=True)
def test_a_claim_cancelled_while_queued_in_a_dispatchers_pool_gives_its_slot_back_without_running():
    stopping, lost = threading.Event(), threading.Event()
    pool = WorkerPool(name="slots-pool", queues=None, size=1, stopping=stopping, on_free=lambda: None, on_lost=lost.set)
    pool.start()
    try:
        gate = KeyedGate.start(account="pool")
        pool.hand_out(claim_due_steps(1, queues=["gated"], claimed_by="slots-pool"), verify=True)
        eventually(lambda: SideEffect.objects.filter(label="gate-start").exists(), what="the gated body to start")
        queued = SlotSync.start(account=12)
        pool.hand_out(_claim(), verify=True)  # the one worker is in a body: the claim waits in the shared queue
        queued.cancel()
        SideEffect.objects.create(label="gate-open", key=str(gate.workflow_id))

        eventually(lambda: _in_use("concurrency:slots:12") == 0, what="the cancelled claim's slot to come back")
        eventually(lambda: gate.reload().status == "finished", what="the gated run to finish")
        assert not WorkflowEvent.objects.filter(run=queued.record, kind="outcome_discarded").exists()  # never ran
    finally:
        stopping.set()
        assert not pool.join(time.monotonic() + 30), "a worker did not finish"
    assert not lost.is_set()


@pytest.mark.django_db
def test_the_limiters_list_says_when_the_sweep_repaired_a_keys_slots(admin_client):
    SlotSync.start(account=14)
    [claimed] = _claim()
    WorkflowRun.objects.filter(pk=claimed.run_id).delete()
    reconcile(clock.now())

    html = admin_client.get(reverse("admin:pgbus_workflows_workflowlimiter_changelist")).content.decode()

    assert "Slots repaired at" in html
    assert '<td class="field-repaired_at nowrap">-</td>' not in html  # the one key was repaired: a time
    assert '<td class="field-repaired_at nowrap">' in html
