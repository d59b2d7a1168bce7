"""Which of a dispatcher's worker threads run the work: few awake ones while bodies are quick.

Steps arriving one at a time (web requests starting runs) would each wake the longest idle
thread of sixteen; the most recently idle is woken instead, and while four workers are active
the others leave quick work to them. Work never waits long behind a body that turned out slow.
"""

import signal
import sys
import threading
import time
from collections import Counter

import pytest

from pgbus_workflows import Workflow, step
from pgbus_workflows.dispatcher import taking as taking_module
from pgbus_workflows.dispatcher import workers as workers_module
from pgbus_workflows.dispatcher.workers import WorkerPool
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services import executor
from pgbus_workflows.services.claims import claim_due_steps, claim_step
from tests.procs import eventually
from tests.testapp.models import SideEffect
from tests.testapp.workflows import LongChain, NoOp3, Slow

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pool_of():
    """A started pool of ``size`` workers, stopped (every claim finished) after the test."""
    started = []

    def make(size):
        stopping, lost = threading.Event(), threading.Event()
        pool = WorkerPool(name="w", queues=None, size=size, stopping=stopping, on_free=lambda: None, on_lost=lost.set)
        pool.start()
        started.append((pool, stopping, lost))
        return pool

    yield make
    for pool, stopping, lost in started:
        stopping.set()
        assert not pool.join(time.monotonic() + 30), "a worker did not finish"
        assert not lost.is_set()


def test_steps_arriving_one_at_a_time_run_on_the_warm_worker_not_on_each_of_sixteen(pool_of, monkeypatch):
    writers = Counter()
    real_apply = workers_module.apply_outcomes

    def counted(performed, chain):
        writers[threading.current_thread().name] += 1
        return real_apply(performed, chain)

    monkeypatch.setattr(workers_module, "apply_outcomes", counted)
    pool = pool_of(16)
    for _ in range(30):
        wf = NoOp3.start()
        step = WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled")
        pool.hand_out([claim_step(step.pk, claimed_by="w")], verify=True)
        eventually(lambda wf=wf: wf.reload().status == "finished", what="the run to finish")
        eventually(lambda: len(pool.taking._idle) == 16, what="every worker idle again")

    # The worker that worked last is woken each time; the longest idle would be each of the sixteen in turn.
    assert len(writers) == 1 and sum(writers.values()) == 90, writers


def test_a_burst_of_quick_steps_runs_on_about_four_of_sixteen_workers(pool_of, monkeypatch):
    runners = Counter()
    real_perform = workers_module.begin_step

    def counted(step, **kwargs):
        runners[threading.current_thread().name] += 1
        return real_perform(step, **kwargs)

    monkeypatch.setattr(workers_module, "begin_step", counted)
    pool = pool_of(16)
    warm = NoOp3.start()
    pool.hand_out(claim_due_steps(1, claimed_by="w"), verify=True)  # the pool learns its bodies are quick
    eventually(lambda: warm.reload().status == "finished", what="the warm-up run")
    eventually(lambda: len(pool.taking._idle) == 16, what="every worker idle again")
    runners.clear()

    burst = [NoOp3.start() for _ in range(60)]
    pool.hand_out(claim_due_steps(60, claimed_by="w"), verify=True)  # 180 quick bodies: 60 claimed, 120 chained
    eventually(lambda: all(wf.reload().status == "finished" for wf in burst), what="the burst")

    # Four active workers take it (a fifth may join while one of them finds the queue empty
    # for a moment, then stays); the others sleep through it.
    assert sum(runners.values()) == 180
    busiest = sum(count for _, count in runners.most_common(4))
    assert busiest >= 0.75 * 180 and len(runners) <= 6, runners  # waking all, each of the 16 ran some


@pytest.mark.parametrize("size", [4, 16])
def test_a_claim_of_quick_steps_is_shared_in_chunks_of_the_four_awake_whatever_the_pool_size(
    pool_of, monkeypatch, size
):
    checks = []
    real_check = taking_module.still_in_progress

    def counted(step_pks):
        checks.append(len(step_pks))
        return real_check(step_pks)

    monkeypatch.setattr(taking_module, "still_in_progress", counted)
    pool = pool_of(size)
    warm = NoOp3.start()
    pool.hand_out(claim_due_steps(1, claimed_by="w"), verify=True)  # the pool learns its bodies are quick
    eventually(lambda: warm.reload().status == "finished", what="the warm-up run")
    eventually(lambda: len(pool.taking._idle) == size, what="every worker idle again")

    burst = [NoOp3.start() for _ in range(60)]
    pool.hand_out(claim_due_steps(60, claimed_by="w"), verify=True)
    eventually(lambda: all(wf.reload().status == "finished" for wf in burst), what="the burst")

    # 59 wait in the shared queue (one goes straight to a worker): each chunk a quarter of what
    # is left, as four workers share it (about 15 re-checks, each a round trip); a sixteenth,
    # as a pool of sixteen did, took 40 and more.
    assert sum(checks) == 59
    assert len(checks) <= 20, checks


def test_a_quick_step_is_not_held_up_behind_awake_workers_whose_bodies_turned_out_slow(pool_of):
    pool = pool_of(4)
    warm = [NoOp3.start() for _ in range(5)]
    pool.hand_out(claim_due_steps(5, claimed_by="w"), verify=True)
    eventually(lambda: all(wf.reload().status == "finished" for wf in warm), what="the quick bodies")
    slow = [Slow.start(seconds=3) for _ in range(2)]
    pool.hand_out(claim_due_steps(2, claimed_by="w"), verify=True)
    eventually(lambda: SideEffect.objects.filter(label="slow-start").count() == 2, what="both slow bodies")

    quick = NoOp3.start()
    pool.hand_out(claim_due_steps(1, claimed_by="w"), verify=True)
    eventually(lambda: quick.reload().current_step != "a", what="the quick step to run")
    assert not SideEffect.objects.filter(label="slow-end").exists(), "it waited for a slow body"
    eventually(lambda: all(wf.reload().status == "finished" for wf in slow), what="the slow runs")


def test_a_claim_handed_to_an_idle_worker_starts_without_a_re_check_and_queued_ones_are_re_checked(
    pool_of, monkeypatch
):
    rechecked = []
    real_check = taking_module.still_in_progress

    def counted(step_pks):
        rechecked.extend(step_pks)
        return real_check(step_pks)

    monkeypatch.setattr(taking_module, "still_in_progress", counted)  # a chunk of the shared queue
    monkeypatch.setattr(executor, "still_in_progress", counted)  # a claim run with verify=True
    pool = pool_of(1)
    eventually(lambda: len(pool.taking._idle) == 1, what="the worker idle")
    wf = NoOp3.start()
    (fresh,) = claim_due_steps(1, claimed_by="w")
    pool.hand_out([fresh], verify=True)  # the worker is idle: it takes the claim in hand and starts it
    eventually(lambda: wf.reload().status == "finished", what="the run to finish")
    assert rechecked == []

    # A worker inside a body: what the loop claims meanwhile waits in the shared queue, and
    # may be cancelled there, so it is re-checked before its body runs (a cancelled one never runs).
    slow = Slow.start(seconds=1)
    pool.hand_out(claim_due_steps(1, claimed_by="w"), verify=True)
    eventually(lambda: SideEffect.objects.filter(label="slow-start").exists(), what="the slow body")
    waiting, cancelled = NoOp3.start(), NoOp3.start()
    queued = claim_due_steps(2, claimed_by="w")
    pool.hand_out(queued, verify=True)
    cancelled.cancel()
    eventually(lambda: waiting.reload().status == "finished" and slow.reload().status == "finished", what="both")
    assert sorted(rechecked) == sorted(step.pk for step in queued)
    assert cancelled.reload().status == "cancelled"
    assert not WorkflowStep.objects.filter(run_id=cancelled.record.pk, status="completed").exists()


def test_new_work_is_taken_between_the_bodies_of_four_workers_busy_with_long_chains(pool_of):
    pool = pool_of(5)
    warm = [NoOp3.start() for _ in range(3)]
    pool.hand_out(claim_due_steps(3, claimed_by="w"), verify=True)  # bodies are quick, as far as the pool knows
    eventually(lambda: all(wf.reload().status == "finished" for wf in warm), what="the warm-up runs")
    chains = [LongChain.start() for _ in range(4)]
    pool.hand_out(claim_due_steps(4, claimed_by="w"), verify=True)  # four workers, each chaining its run's steps
    eventually(lambda: all(wf.reload().current_step >= "s005" for wf in chains), what="four chains running")

    quick = NoOp3.start()
    pool.hand_out(claim_due_steps(1, claimed_by="w"), verify=True)  # four active: the fifth sleeps, they take it
    eventually(lambda: quick.reload().current_step != "a", what="the quick run's first step")

    assert not any(wf.reload().status == "finished" for wf in chains), "it waited for a chain to end"
    eventually(lambda: all(wf.reload().status == "finished" for wf in [*chains, quick]), what="every run")


#: Set by :class:`HeldUntilReleased`'s body once it runs; the body returns once ``RELEASE`` is set.
HOLDING, RELEASE = threading.Event(), threading.Event()


class HeldUntilReleased(Workflow):
    name = "pool_held_until_released"

    @step
    def hold(self):
        HOLDING.set()
        RELEASE.wait(60)


def _waits_in_a_join(thread):
    """Whether ``thread`` is inside a ``Thread.join`` (waiting in C below it, on every Python version)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "join" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False


def test_a_signal_the_kernel_gives_a_worker_runs_its_handler_while_the_main_thread_joins_the_pool():
    """As a dispatcher's second SIGTERM while it waits for its running steps: handled then, not after the wait."""
    main = threading.main_thread()
    if threading.current_thread() is not main:
        pytest.skip("signal handlers are installed on the main thread only")
    HOLDING.clear()
    RELEASE.clear()
    HeldUntilReleased.start()
    stopping = threading.Event()
    pool = WorkerPool(name="w", queues=None, size=1, stopping=stopping, on_free=lambda: None, on_lost=lambda: None)
    pool.start()
    pool.hand_out(claim_due_steps(1, claimed_by="w"), verify=True)
    eventually(HOLDING.is_set, what="the body to run")
    [worker] = pool._threads
    handled = []

    def handler(signum, frame):
        handled.append(signum)
        RELEASE.set()

    def signal_the_worker_once_the_main_thread_joins():
        eventually(lambda: _waits_in_a_join(main), what="the main thread to wait in a join")
        signal.pthread_kill(worker.ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, handler)
    sender = threading.Thread(target=signal_the_worker_once_the_main_thread_joins)
    try:
        sender.start()
        stopping.set()
        assert not pool.join(time.monotonic() + 20), "the handler ran only once the join gave up"
        assert handled == [signal.SIGUSR1]
    finally:
        RELEASE.set()
        sender.join(30)
        signal.signal(signal.SIGUSR1, previous)
