"""The dispatcher's event loop: ``async def`` bodies and jobs await on it and hold no worker thread.

A worker pool built as the dispatcher builds it (``async_capacity``), fed steps claimed from
the database. Bodies wait on a gate (an event the test opens) so how many await at once is
read while none has ended.
"""

import asyncio
import gc
import inspect
import logging
import threading
import time

import pytest
from asgiref.sync import SyncToAsync, sync_to_async

from pgbus_workflows import Job, Workflow, fan_out, step
from pgbus_workflows.dispatcher import coroutines
from pgbus_workflows.dispatcher.workers import WorkerPool
from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowStep
from pgbus_workflows.services import fanout
from pgbus_workflows.services.claims import claim_due_steps, stall
from tests.procs import eventually
from tests.testapp.async_workflows import (
    GATE,
    SHARED_CLIENT,
    EchoServer,
    NeverReturns,
    SwallowsCancel,
    UsesSharedClient,
    gated_job,
)
from tests.testapp.models import SideEffect
from tests.testapp.workflows import NoOp3

pytestmark = pytest.mark.django_db(transaction=True)


#: The threads the gated bodies' awaited sync calls ran on.
ORM_THREADS = set()
#: The event loops the gated bodies ran on.
LOOPS = set()


def began(label):
    return SideEffect.objects.filter(label=label).exists()


@pytest.fixture(autouse=True)
def gate():
    GATE.reset()
    ORM_THREADS.clear()
    LOOPS.clear()
    SHARED_CLIENT.forget()
    yield GATE
    GATE.opened.set()


class Gated(Workflow):
    """One async step that waits for the gate, then a plain one."""

    name = "coroutines_gated"
    allow_multiple = True

    @step
    async def call(self):
        LOOPS.add(id(asyncio.get_running_loop()))
        ORM_THREADS.add(await sync_to_async(threading.get_ident)())
        await GATE.wait(str(self.workflow_id))
        return {"n": self.arguments["n"]}

    @step
    def record(self):
        return self.outputs["call"]["n"]


class Blocking(Workflow):
    """An async body that blocks the loop (a sync sleep) instead of awaiting."""

    name = "coroutines_blocking"

    @step
    async def blocks(self):
        time.sleep(0.25)  # the mistake this class is about
        return "done"


class Hangs(Workflow):
    """An async body that outlives its step's timeout."""

    name = "coroutines_hangs"

    @step(timeout=0.3)
    async def hangs(self):
        await asyncio.sleep(3600)


class GatedFanOut(Workflow):
    name = "coroutines_gated_fan_out"

    @fan_out
    def spread(self):
        return [Job(gated_job, n) for n in range(6)]

    @step
    def total(self):
        return sum(self.fan_out_results("spread"))


@pytest.fixture
def pool_of():
    """A started pool of ``size`` workers with an event loop for ``awaiting`` bodies."""
    started = []

    def make(size, awaiting):
        stopping, lost = threading.Event(), threading.Event()
        pool = WorkerPool(
            name="w",
            queues=None,
            size=size,
            stopping=stopping,
            on_free=lambda: None,
            on_lost=lost.set,
            async_capacity=awaiting,
        )
        pool.start()
        started.append((pool, stopping, lost))
        return pool

    yield make
    GATE.opened.set()
    for pool, stopping, lost in started:
        stopping.set()
        assert not pool.join(time.monotonic() + 30), "a worker did not finish"
        assert not lost.is_set()


def claim_all(pool):
    """Claim every due step and hand it to ``pool``, as the dispatcher's loop does."""
    claimed = claim_due_steps(100, None, "w")
    pool.hand_out(claimed, verify=True)
    return claimed


def finished(pool, *runs):
    """A check for ``eventually``: claims what is due (as the loop would), then whether ``runs`` finished."""

    def check():
        claim_all(pool)
        return all(wf.reload().status == "finished" for wf in runs)

    return check


def test_one_worker_thread_awaits_ten_bodies_at_once_and_still_runs_plain_steps(pool_of):
    runs = Gated.start_many([{"arguments": {"n": n}} for n in range(10)])
    pool = pool_of(1, awaiting=20)
    claim_all(pool)
    eventually(lambda: len(GATE.entered) == 10, what="all ten bodies to await at once on one worker")
    assert pool.free_slots() >= 1, "bodies awaiting on the loop hold no worker: the loop may claim more"
    [orm_thread] = ORM_THREADS  # asgiref's one database thread, as outside a request
    assert orm_thread not in {thread.ident for thread in pool._threads}

    plain = NoOp3.start()
    eventually(finished(pool, plain), what="a plain run to finish beside ten awaiting bodies")
    assert not any(wf.reload().status == "finished" for wf in runs)

    GATE.opened.set()
    eventually(finished(pool, *runs), what="the ten runs to finish")
    assert sorted(wf.reload().outputs["record"] for wf in runs) == list(range(10))


def test_past_its_places_the_next_bodies_hold_their_workers_on_the_same_loop(pool_of):
    Gated.start_many([{"arguments": {"n": n}} for n in range(110)])
    pool = pool_of(4, awaiting=100)
    eventually(
        lambda: claim_all(pool) == [] and len(GATE.entered) == 104,
        what="a hundred bodies in the loop's places and four held by the threads",
    )
    assert pool.coroutines.full()
    assert len(LOOPS) == 1, "every body awaits on the dispatcher's one loop"
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        assert len(GATE.entered) == 104, "a claimed body waits for a place rather than past the capacity"
        time.sleep(0.02)
    GATE.opened.set()
    eventually(
        lambda: WorkflowStep.objects.filter(step_name="call", status="completed").count() == 110,
        what="the 110 outcomes to be written",
    )
    assert len(LOOPS) == 1


def test_without_places_each_body_holds_its_worker_on_the_one_loop(pool_of):
    Gated.start_many([{"arguments": {"n": n}} for n in range(3)])
    pool = pool_of(1, awaiting=0)
    claim_all(pool)
    eventually(lambda: len(GATE.entered) == 1, what="the first body")
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        assert len(GATE.entered) == 1, "one worker, no places: one body at a time"
        time.sleep(0.02)
    GATE.opened.set()
    eventually(
        lambda: WorkflowStep.objects.filter(step_name="call", status="completed").count() == 3,
        what="the three outcomes",
    )
    assert len(LOOPS) == 1, "the three bodies awaited on one long-lived loop"
    assert LOOPS == {id(pool.coroutines._loop)}


@pytest.mark.parametrize("places", [2, 0])
def test_a_module_level_client_serves_every_async_body(pool_of, places):
    with EchoServer() as server:
        runs = UsesSharedClient.start_many([{"arguments": {"n": n, "port": server.port}} for n in range(24)])
        pool = pool_of(4, awaiting=places)
        eventually(finished(pool, *runs), timeout=60, what="the 24 runs to finish")
        assert not SHARED_CLIENT.closed
        pool._stopping.set()
        assert not pool.join(time.monotonic() + 30)
    assert sorted(int(wf.reload().outputs["call"]) for wf in runs) == list(range(24))
    assert SHARED_CLIENT.closed, "the client registered with on_loop_shutdown was closed on the loop as it stopped"


def stall_attempt(step):
    assert stall(step.pk, step.run_id, detection="orphaned_claim")


def test_a_stalled_body_that_never_returns_is_cancelled_and_frees_its_place(pool_of):
    wf = NeverReturns.start()
    pool = pool_of(1, awaiting=1)
    [step] = claim_all(pool)
    eventually(lambda: pool.coroutines.in_flight() == 1 and began("never-returns-began"), what="the body")
    assert pool.cancel_stalled() == 0, "an attempt in progress keeps its body"

    stall_attempt(step)
    assert pool.cancel_stalled() == 1
    eventually(lambda: pool.coroutines.in_flight() == 0, what="the cancelled body to leave the loop")
    assert ("step", step.pk) not in pool.held()
    assert WorkflowStep.objects.get(pk=step.pk).outcome == "stalled", "the stall's end stands, none written after"

    # Its reattempt takes the freed place: it awaits in it, holding no worker.
    [again] = claim_all(pool)
    assert again.run_id == wf.record.pk
    eventually(lambda: pool.coroutines.in_flight() == 1, what="the reattempt in the freed place")
    assert pool.free_slots() >= 1
    stall_attempt(again)
    pool.cancel_stalled()


def test_a_body_swallowing_its_cancellation_is_logged_and_no_longer_counted(pool_of, caplog, monkeypatch):
    monkeypatch.setattr(coroutines, "CANCEL_GRACE", 0.2)
    wf = SwallowsCancel.start()
    pool = pool_of(1, awaiting=1)
    [step] = claim_all(pool)
    eventually(lambda: began("swallows-began"), what="the body")
    stall_attempt(step)
    with caplog.at_level(logging.ERROR, logger="pgbus_workflows"):
        assert pool.cancel_stalled() == 1
        eventually(lambda: pool.coroutines.in_flight() == 0, what="the body to be given up")
    [logged] = [record.getMessage() for record in caplog.records if "swallows CancelledError" in record.getMessage()]
    assert logged.startswith(f"async_swallows_cancel {wf.workflow_id} step call (attempt 1) did not end")
    assert ("step", step.pk) not in pool.held()
    assert not pool.coroutines.claims()
    assert len(pool.coroutines._unending) == 1, "it runs on, referenced, uncounted"


def test_async_jobs_await_on_the_loop_together(pool_of):
    wf = GatedFanOut.start()
    pool = pool_of(1, awaiting=10)
    claim_all(pool)
    eventually(lambda: FanOutJob.objects.count() == 6, what="the fan-out's jobs")
    jobs = fanout.claim_due_jobs(10, None, "w")
    pool.hand_out(jobs, verify=True)
    eventually(lambda: len(GATE.entered) == 6, what="the six async jobs to await at once on one worker")
    GATE.opened.set()
    eventually(finished(pool, wf), what="the fan-out to resolve and the run to end")
    assert wf.reload().outputs["total"] == sum(n * 10 for n in range(6))


def test_without_places_async_jobs_hold_their_worker_on_the_one_loop(pool_of):
    wf = GatedFanOut.start()
    pool = pool_of(1, awaiting=0)
    claim_all(pool)
    eventually(lambda: FanOutJob.objects.count() == 6, what="the fan-out's jobs")
    pool.hand_out(fanout.claim_due_jobs(10, None, "w"), verify=True)
    eventually(lambda: len(GATE.entered) == 1, what="the first job, held by the one worker")
    assert pool.coroutines.in_flight() == 0 and len(pool.coroutines.claims()) == 1
    GATE.opened.set()
    eventually(finished(pool, wf), what="the fan-out to resolve and the run to end")
    assert wf.reload().outputs["total"] == sum(n * 10 for n in range(6))


def test_a_body_that_blocks_the_loop_is_logged_by_name(pool_of, caplog):
    wf = Blocking.start()
    pool = pool_of(1, awaiting=10)
    with caplog.at_level(logging.WARNING, logger="pgbus_workflows"):
        claim_all(pool)
        eventually(lambda: wf.reload().status == "finished", what="the blocking body to end")
    [warning] = [record.getMessage() for record in caplog.records if "held the event loop" in record.getMessage()]
    named = f"coroutines_blocking {wf.workflow_id} step blocks (attempt 1)"
    assert warning.startswith(f"{named} held the event loop for 0.2")
    assert "sync_to_async" in warning


def test_a_body_past_its_timeout_is_cancelled_on_the_loop_and_its_attempt_stalls(pool_of):
    wf = Hangs.start()
    pool = pool_of(1, awaiting=10)
    claim_all(pool)
    eventually(
        lambda: WorkflowEvent.objects.filter(run=wf.record, kind="step_stalled").exists(),
        what="the attempt to stall at its timeout",
    )
    event = WorkflowEvent.objects.get(run=wf.record, kind="step_stalled")
    assert event.details["detection"] == "timeout"
    assert "cancelled after its timeout" in event.details["cause"]


def test_stopping_waits_for_awaiting_bodies_to_end_and_write_their_outcomes(pool_of):
    runs = Gated.start_many([{"arguments": {"n": n}} for n in range(3)])
    pool = pool_of(1, awaiting=10)
    claim_all(pool)
    eventually(lambda: len(GATE.entered) == 3, what="three bodies awaiting")
    pool._stopping.set()
    threading.Timer(0.3, GATE.opened.set).start()
    assert not pool.join(time.monotonic() + 30), "the workers waited for the awaiting bodies"
    assert not GATE.cancelled
    assert [WorkflowStep.objects.get(run=wf.record, step_name="call").status for wf in runs] == ["completed"] * 3


def test_past_the_grace_the_awaiting_bodies_are_cancelled(pool_of):
    Gated.start_many([{"arguments": {"n": n}} for n in range(3)])
    pool = pool_of(1, awaiting=10)
    claim_all(pool)
    eventually(lambda: len(GATE.entered) == 3, what="three bodies awaiting")
    pool._stopping.set()
    assert pool.join(time.monotonic() + 0.3), "bodies still awaiting at the deadline are reported abandoned"
    assert GATE.cancelled == GATE.entered
    # Their attempts are the dispatcher's to stall (``_stall_own``): still in progress here.
    assert set(WorkflowStep.objects.filter(step_name="call").values_list("status", flat=True)) == {"in_progress"}


def test_a_run_cancelled_while_its_body_awaits_on_the_loop_keeps_its_cancel(pool_of):
    wf = Gated.start(n=1)
    pool = pool_of(1, awaiting=10)
    claim_all(pool)
    eventually(lambda: len(GATE.entered) == 1, what="the body awaiting")

    wf.cancel(actor="bob", reason="customer asked")
    GATE.opened.set()

    discarded = WorkflowEvent.objects.filter(run=wf.record, kind="outcome_discarded")
    eventually(discarded.exists, what="the body's outcome to be discarded")
    assert discarded.get().details["outcome"] == "success"
    assert wf.reload().status == "cancelled"
    row = WorkflowStep.objects.get(run=wf.record)
    assert (row.step_name, row.status, row.outcome, row.output) == ("call", "cancelled", "cancelled", None)


def test_a_body_left_unending_when_the_loop_stops_runs_no_code_where_it_is_collected(pool_of, monkeypatch):
    """Its coroutine is closed with its loop: collected later, it awaits nothing in another body's context.

    A pending task collected by the garbage collector closes its coroutine there and then, in
    whatever context runs: a ``GeneratorExit`` caught and followed by an await (asgiref's
    ``sync_to_async``) left asgiref's deadlock flag set in a running body's context, whose next
    ``sync_to_async`` then failed ("Single thread executor already being used").
    """
    monkeypatch.setattr(coroutines, "CANCEL_GRACE", 0.2)
    SwallowsCancel.start()
    pool = pool_of(1, awaiting=1)
    [step] = claim_all(pool)
    eventually(lambda: began("swallows-began"), what="the body")
    stall_attempt(step)
    pool.cancel_stalled()
    eventually(lambda: pool.coroutines._unending, what="the body to be given up")
    [task] = pool.coroutines._unending
    coroutine = task.get_coro()
    pool.coroutines.close(cancel=True, timeout=0.5)
    eventually(lambda: not pool.coroutines._thread.is_alive(), what="the loop's thread to end")
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
    del task, coroutine
    pool.coroutines._unending.clear()

    async def another_body():
        gc.collect()  # as it may happen anywhere: here, on a loop, in a body's context
        return SyncToAsync.deadlock_context.get(False)

    assert asyncio.run(another_body()) is False


def test_a_body_closed_while_another_awaits_awaits_nothing_in_the_others_context(pool_of):
    """As the garbage collector closes a collected task's coroutine: in whatever body runs then."""
    SwallowsCancel.start()
    pool = pool_of(1, awaiting=1)
    claim_all(pool)
    eventually(lambda: began("swallows-began"), what="the body")
    [body] = pool.coroutines._bodies.values()

    async def another_body():
        body.task.get_coro().close()
        return SyncToAsync.deadlock_context.get(False)

    assert asyncio.run_coroutine_threadsafe(another_body(), pool.coroutines._loop).result(10) is False
    eventually(lambda: pool.coroutines.in_flight() == 0, what="the closed body's place to be freed")
    assert not pool.coroutines.claims()
