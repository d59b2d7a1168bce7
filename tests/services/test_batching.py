"""Outcomes of several runs written in one transaction, and the worker pool that batches them.

``apply_outcomes`` is what a dispatcher worker calls with the outcomes of the quick steps it
ran; these tests call it as the worker does (claim, perform, apply) and race it with real
threads and real dispatcher processes.
"""

import logging
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from pgbus_workflows import Job, Workflow, fan_out, step
from pgbus_workflows.checks import check_settings
from pgbus_workflows.dispatcher.workers import WorkerPool
from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services import outcome as outcome_module
from pgbus_workflows.services.claims import claim_due_steps, still_in_progress
from pgbus_workflows.services.executor import Chain, apply_outcomes, execute_step, perform_step
from pgbus_workflows.services.fanout import claim_due_jobs, record_job_ends, run_job
from pgbus_workflows.sql import rows
from tests.procs import eventually
from tests.support import sessions_waiting_for_a_lock
from tests.testapp.jobs import fail_on, nothing
from tests.testapp.models import SideEffect
from tests.testapp.workflows import Counted, NoOp3, Slow
from tests.threads import JOIN_TIMEOUT, Worker

pytestmark = pytest.mark.django_db(transaction=True)


def perform_all(steps, chain=None):
    """Run the bodies of claimed steps as a worker does; the outcomes are left to apply."""
    performed = [perform_step(step, chain=chain) for step in steps]
    assert all(isinstance(item, tuple) for item in performed)
    return performed


def transitions(run):
    return list(
        WorkflowEvent.objects.filter(run=run).exclude(transition="").order_by("pk").values_list("transition", flat=True)
    )


def test_the_outcomes_of_several_runs_are_applied_together_and_chain_their_next_steps():
    runs = [NoOp3.start() for _ in range(5)]
    chain = Chain("worker-1")
    claimed = claim_due_steps(10, claimed_by="worker-1")
    assert len(claimed) == 5

    results = apply_outcomes(perform_all(claimed, chain), chain)

    assert [r.kind for r in results] == ["success"] * 5
    chained = chain.take()
    assert sorted(s.run_id for s in chained) == sorted(wf.record.pk for wf in runs)
    for wf in runs:
        first, second = WorkflowStep.objects.filter(run=wf.record).order_by("pk")
        assert (first.step_name, first.status, first.outcome) == ("a", "completed", "success")
        assert (second.step_name, second.status, second.claimed_by, second.attempt) == (
            "b",
            "in_progress",
            "worker-1",
            1,
        )
        assert wf.reload().status == "performing"
        assert transitions(wf.record) == ["claim", "advance", "claim"]
        started = WorkflowEvent.objects.filter(run=wf.record, kind="step_started").order_by("pk").last()
        assert started.step_id == second.pk  # the event names the step inserted in the same batch
        assert started.details == {"attempt": 1, "claimed_by": "worker-1"}
    assert {s.pk for s in chained} == set(WorkflowStep.objects.filter(step_name="b").values_list("pk", flat=True))


def test_a_batch_carries_three_step_runs_to_the_end():
    runs = [NoOp3.start() for _ in range(4)]
    chain = Chain("w")
    batch = claim_due_steps(10, claimed_by="w")
    while batch:
        apply_outcomes(perform_all(batch, chain), chain)
        batch = chain.take()

    for wf in runs:
        assert wf.reload().status == "finished"
        assert transitions(wf.record) == ["claim", "advance", "claim", "advance", "claim", "finish"]
    assert WorkflowStep.objects.filter(status="completed").count() == 12


def test_a_run_cancelled_while_its_body_ran_keeps_its_cancel_and_the_others_move_on():
    runs = [NoOp3.start() for _ in range(3)]
    claimed = claim_due_steps(10, claimed_by="w")
    performed = perform_all(claimed)
    victim = next(wf for wf in runs if wf.record.pk == claimed[1].run_id)
    victim.cancel(reason="operator")

    results = apply_outcomes(performed, Chain("w"))

    assert results[1].kind == "success"  # the outcome existed; it was recorded as discarded
    assert victim.reload().status == "cancelled"
    discarded = WorkflowEvent.objects.get(run=victim.record, kind="outcome_discarded")
    assert discarded.details["step_status"] == "cancelled"
    for wf in runs:
        if wf is not victim:
            assert wf.reload().status == "performing"
            assert WorkflowStep.objects.get(run=wf.record, step_name="a").status == "completed"


def test_an_outcome_that_cannot_be_applied_does_not_hold_back_the_others(monkeypatch, caplog):
    runs = [NoOp3.start() for _ in range(3)]
    claimed = claim_due_steps(10, claimed_by="w")
    bad_run = claimed[1].run_id
    real = outcome_module.apply_outcome

    def apply_or_break(ledger, step, outcome):
        if ledger.run.pk == bad_run:
            raise RuntimeError("this row is broken")
        real(ledger, step, outcome)

    monkeypatch.setattr("pgbus_workflows.services.applying.apply_outcome", apply_or_break)
    with caplog.at_level(logging.ERROR, "pgbus_workflows"), pytest.raises(RuntimeError, match="broken"):
        apply_outcomes(perform_all(claimed), Chain("w"))

    assert "applying them one by one" in caplog.text
    for wf in runs:
        first = WorkflowStep.objects.get(run=wf.record, step_name="a")
        expected = "in_progress" if wf.record.pk == bad_run else "completed"
        assert first.status == expected, wf.record.pk
    # The broken one is still claimed: the dispatcher's orphan recovery (or the sweep) stalls it.
    assert WorkflowStep.objects.filter(run_id=bad_run, step_name="b").count() == 0


def test_two_batches_over_the_same_runs_in_opposite_orders_never_deadlock():
    """Runs are locked in key order whatever the order of the batch: no deadlock, one winner per run."""
    [NoOp3.start() for _ in range(30)]
    claimed = claim_due_steps(30, claimed_by="w")
    performed = perform_all(claimed)
    barrier = threading.Barrier(2)

    def apply(items):
        barrier.wait()
        return apply_outcomes(items, Chain("w"))

    forward = Worker(apply, performed)
    backward = Worker(apply, list(reversed(performed)))
    forward.start()
    backward.start()
    forward.finish()
    backward.finish()

    assert WorkflowStep.objects.filter(step_name="a", status="completed").count() == 30
    assert WorkflowStep.objects.filter(step_name="b").count() == 30  # each run advanced once
    discarded = Counter(WorkflowEvent.objects.filter(kind="outcome_discarded").values_list("run_id", flat=True))
    assert len(discarded) == 30 and set(discarded.values()) == {1}


def test_the_outcomes_lock_takes_every_run_before_any_of_their_steps():
    """A batch waiting for a run another transaction holds has locked none of the steps yet."""
    first, second = NoOp3.start(), NoOp3.start()
    steps = {wf.record.pk: WorkflowStep.objects.get(run=wf.record).pk for wf in (first, second)}
    held, release = threading.Event(), threading.Event()

    def hold_the_second_run():
        with transaction.atomic():
            rows.lock(WorkflowRun, {"id": second.record.pk})
            held.set()
            release.wait(JOIN_TIMEOUT)

    def lock_the_batch():
        with transaction.atomic():
            return rows.lock_pairs(WorkflowRun, WorkflowStep, "run_id", list(steps.items()))[0]

    holder = Worker(hold_the_second_run)
    holder.start()
    assert held.wait(JOIN_TIMEOUT)
    batch = Worker(lock_the_batch)
    batch.start()
    eventually(lambda: len(sessions_waiting_for_a_lock()) == 1, what="the batch to wait for the second run")

    with transaction.atomic():  # had it locked a step first, NOWAIT would fail here
        free = list(WorkflowStep.objects.select_for_update(nowait=True).filter(pk__in=steps.values()))
    release.set()
    holder.finish()
    locked = batch.finish()

    assert len(free) == 2
    assert {pk: (run.pk, step.pk) for pk, (run, step) in locked.items()} == {s: (r, s) for r, s in steps.items()}


def test_still_in_progress_tells_which_claims_were_cancelled_since():
    runs = [NoOp3.start() for _ in range(3)]
    claimed = claim_due_steps(10, claimed_by="w")
    cancelled = next(wf for wf in runs if wf.record.pk == claimed[0].run_id)
    cancelled.cancel()

    assert still_in_progress([s.pk for s in claimed]) == {s.pk for s in claimed[1:]}
    assert still_in_progress([]) == set()


def test_build_makes_the_same_instance_as_the_model_constructor():
    wf = NoOp3.start()
    now = timezone.now()
    values = {
        "run": wf.record,
        "step_name": "b",
        "attempt": 2,
        "queue": "q",
        "priority": 3,
        "scheduled_at": now,
        "timeout": timedelta(seconds=5),
        "created_at": now,
    }

    built = rows.build(WorkflowStep, **values)
    made = WorkflowStep(**values)

    fields = [f.attname for f in WorkflowStep._meta.concrete_fields]
    assert {f: getattr(built, f) for f in fields} == {f: getattr(made, f) for f in fields}
    assert built.run is wf.record and built._state.adding and built.pk is None
    # The database allows one active attempt per run: end the first before saving a second.
    WorkflowStep.objects.filter(run=wf.record).update(status="completed")
    built.save()
    assert WorkflowStep.objects.get(pk=built.pk).timeout == timedelta(seconds=5)


def test_build_gives_every_instance_its_own_mutable_default():
    first = rows.build(WorkflowEvent, kind="x")
    second = rows.build(WorkflowEvent, kind="y")
    first.details["k"] = 1
    assert second.details == {}


@pytest.mark.parametrize("value", [0, -1, 2.5, "10", True])
def test_batch_size_must_be_a_positive_integer(value):
    with override_settings(PGBUS_WORKFLOWS={"BATCH_SIZE": value}):
        errors = check_settings()
    assert [e.id for e in errors] == ["pgbus_workflows.E006"]
    assert "BATCH_SIZE" in errors[0].msg


@pytest.mark.processes
def test_a_slow_body_does_not_hold_up_the_quick_steps_claimed_with_it(dispatchers):
    """With two workers, every quick run finishes while the slow body still runs."""
    slow = Slow.start(seconds=3)
    quick = [Counted.start() for _ in range(40)]
    process = dispatchers("--concurrency", "2", settings={"POLL_INTERVAL": 0.2})
    eventually(lambda: SideEffect.objects.filter(label="slow-start").exists(), what="the slow step to start")

    eventually(
        lambda: WorkflowRun.objects.filter(workflow_class="counted", status="finished").count() == 40,
        timeout=2.5,
        what="the quick runs to finish while the slow body runs",
    )
    assert not SideEffect.objects.filter(label="slow-end").exists()
    eventually(lambda: slow.reload().status == "finished", what="the slow run to finish")
    keys = Counter(SideEffect.objects.filter(label__in=["first", "second", "third"]).values_list("key", flat=True))
    assert len(keys) == 120 and set(keys.values()) == {1}, "a step attempt ran twice"
    assert all(wf.reload().status == "finished" for wf in quick)
    process.send(15)
    assert process.wait() == 0


@pytest.mark.processes
def test_once_with_a_batch_size_of_one_still_drains_everything(dispatchers):
    runs = [Counted.start() for _ in range(12)]
    process = dispatchers("--once", "--concurrency", "3", settings={"BATCH_SIZE": 1})
    assert process.wait() == 0, process.output()
    assert all(wf.reload().status == "finished" for wf in runs)
    assert SideEffect.objects.count() == 36


def run_pool(works, size, verify=True):
    """A dispatcher's worker pool over these claims, stopped as soon as it is started.

    Stopping means: nothing new is chained, but every claim handed out is finished.
    """
    stopping = threading.Event()
    lost = threading.Event()
    pool = WorkerPool(name="w", queues=None, size=size, stopping=stopping, on_free=lambda: None, on_lost=lost.set)
    pool.hand_out(works, verify=verify)
    pool.start()
    stopping.set()
    assert not pool.join(time.monotonic() + 30), "a worker did not finish"
    assert pool.held() == set() and not lost.is_set()


def test_the_pool_never_runs_a_claim_cancelled_before_its_body_starts():
    runs = [Counted.start() for _ in range(4)]
    claimed = claim_due_steps(10, claimed_by="w")
    cancelled = {s.run_id for s in claimed[:2]}
    for wf in runs:
        if wf.record.pk in cancelled:
            wf.cancel()

    run_pool(claimed, size=1)

    assert SideEffect.objects.count() == 2  # the first steps of the two live runs, nothing else
    for wf in runs:
        first = WorkflowStep.objects.get(run=wf.record, step_name="first")
        assert first.status == ("cancelled" if wf.record.pk in cancelled else "completed")
    assert not WorkflowEvent.objects.filter(kind="outcome_discarded").exists()


def test_idle_workers_take_the_work_queued_behind_a_slow_body():
    slow = Slow.start(seconds=2)
    [Counted.start() for _ in range(5)]
    claimed = claim_due_steps(10, claimed_by="w")
    assert claimed[0].run_id == slow.record.pk  # the slow body heads the first worker's share

    run_pool(claimed, size=2)

    slow_end = SideEffect.objects.get(label="slow-end").created_at
    firsts = list(SideEffect.objects.filter(label="first"))
    assert len(firsts) == 5
    assert all(effect.created_at < slow_end for effect in firsts), "a quick step waited for the slow body"


# -- fan-out jobs: their ends are written in batches too -------------------------------------------


class FanMixed(Workflow):
    """Jobs returning None, squares and one failing job (retried once), then a step reading them."""

    name = "batch_fan_mixed"

    @fan_out(max_attempts=2)
    def spread(self):
        count = self.arguments.get("count", 3)
        bad = self.arguments.get("bad", [])
        return [Job(nothing, i) for i in range(count)] + [Job(fail_on, n, bad) for n in range(count)]

    @step
    def after(self):
        return {"results": list(self.fan_out_results("spread"))}


def open_fan_out(**arguments):
    wf = FanMixed.start(**arguments)
    (claimed,) = claim_due_steps(1, claimed_by="w")
    execute_step(claimed)
    return wf, WorkflowStep.objects.get(run=wf.record, step_name="spread")


def test_the_ends_of_many_jobs_are_written_together_and_the_fan_out_resolves_once():
    wf, spread = open_fan_out(count=3)
    claimed = claim_due_jobs(100, claimed_by="w")
    assert len(claimed) == 6

    statuses = record_job_ends([run_job(job) for job in claimed], Chain("w"))

    assert statuses == ["succeeded"] * 6
    jobs = list(FanOutJob.objects.filter(step=spread).order_by("index"))
    assert [j.result for j in jobs] == [None, None, None, 0, 1, 2]
    assert all(j.stall_at is None and j.finished_at is not None for j in jobs)
    spread.refresh_from_db()
    assert spread.output == {"total": 6, "succeeded": 6, "failed": 0}
    assert transitions(wf.record).count("resolve") == 1
    assert WorkflowStep.objects.get(run=wf.record, step_name="after").status == "scheduled"


def test_a_failing_job_in_a_batch_is_retried_and_a_job_put_back_meanwhile_is_left_alone():
    wf, spread = open_fan_out(count=2, bad=[1])
    claimed = claim_due_jobs(100, claimed_by="w")
    ends = [run_job(job) for job in claimed]
    put_back = claimed[0]
    FanOutJob.objects.filter(pk=put_back.pk).update(status="pending", claimed_by="")  # as the recovery does

    statuses = record_job_ends(ends)  # no chain: nothing is claimed again

    by_index = dict(zip([job.index for job in claimed], statuses, strict=True))
    assert by_index == {0: "", 1: "succeeded", 2: "succeeded", 3: "pending"}
    retried = FanOutJob.objects.get(step=spread, index=3)
    assert retried.status == "pending" and "fails on purpose" in retried.error
    assert FanOutJob.objects.get(pk=put_back.pk).status == "pending"  # not overwritten
    assert wf.reload().status == "waiting"


def test_the_pool_writes_jobs_ends_in_batches_and_the_run_moves_on():
    wf, spread = open_fan_out(count=20)
    claimed = claim_due_jobs(100, claimed_by="w")

    run_pool(claimed, size=2, verify=False)

    assert set(FanOutJob.objects.filter(step=spread).values_list("status", flat=True)) == {"succeeded"}
    spread.refresh_from_db()
    assert spread.output == {"total": 40, "succeeded": 40, "failed": 0}
    assert WorkflowStep.objects.get(run=wf.record, step_name="after").status == "scheduled"
    assert SideEffect.objects.filter(label="fail_on").count() == 20  # each job ran once
