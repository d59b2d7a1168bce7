"""A fan-out whose jobs all ended: resolved with the last end, else by the next sweep pass, once.

The last job's end and the resolution are one transaction when the run's lock is free; when
another transaction holds the run, the end commits without waiting and the resolution follows
the commit. A dispatcher killed in between (``tests/services/test_fanout_recovery_processes.py``)
leaves a waiting fan-out with every job ended: the dashboard counts it (``fan_out_unresolved``)
and the next sweep pass resolves it, without the ``STALL_THRESHOLD`` wait.
"""

import json
import threading
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.models import FanOutJob, WorkflowStep
from pgbus_workflows.services import fanout, locks
from pgbus_workflows.services.fanout import claim_due_jobs, execute_job, resolve_if_done
from pgbus_workflows.services.fanout_recovery import ended_fan_outs, resolve_lost_fan_outs
from pgbus_workflows.services.stuck import gauge
from tests.procs import eventually
from tests.sql.test_query_plans import nodes, plan_of
from tests.support import events_of, run_next, sessions_waiting_for_a_lock
from tests.testapp.workflows import FanDrain
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def parked(count=2):
    """A FanDrain run parked in its fan-out of ``count`` pending jobs; returns (run, fan-out step)."""
    wf = FanDrain.start(count=count)
    return wf, run_next(wf)


def lose_completion(step):
    """End every job behind the engine's back, a moment ago: the resolution never came."""
    FanOutJob.objects.filter(step_id=step.pk).update(status="succeeded", finished_at=timezone.now(), stall_at=None)


def unresolved(now=None):
    """The dashboard's ``fan_out_unresolved`` count of FanDrain runs."""
    stuck = {(r["workflow_class"], r["reason"]): r["count"] for r in gauge(now or timezone.now())["stuck"]}
    return stuck[("fan_drain", "fan_out_unresolved")]


class HeldRun:
    """The run's row locked (``FOR UPDATE``) by a connection of its own, as a body or an operator holds it."""

    def __init__(self, run_pk):
        s = connection.settings_dict
        self.conn = psycopg.connect(
            dbname=s["NAME"], user=s["USER"], host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432
        )
        self.conn.execute("SELECT 1 FROM pgbus_workflows_workflowrun WHERE id = %s FOR UPDATE", [run_pk])

    def waiters(self):
        """How many connections to this database wait for a lock (for this one's, or queued behind it)."""
        return len(sessions_waiting_for_a_lock())

    def release(self):
        self.conn.rollback()
        self.conn.close()


def test_the_last_jobs_end_resolves_its_fan_out_in_the_same_transaction(monkeypatch):
    wf, step = parked(count=2)
    first, last = claim_due_jobs(10, claimed_by="test")
    assert execute_job(first) == "succeeded"

    def killed(*args, **kwargs):
        raise AssertionError("the dispatcher died after the commit: the resolution after it never runs")

    # Nothing after the end's commit runs (as if the dispatcher died there): the commit resolved it.
    monkeypatch.setattr(fanout, "resolve_if_done", killed)
    assert execute_job(last) == "succeeded"

    step.refresh_from_db()
    assert (step.status, step.output) == ("completed", {"total": 2, "succeeded": 2, "failed": 0})
    assert (wf.reload().status, wf.current_step) == ("ready", "after")
    assert len(events_of(wf, "step_resolved")) == 1


def test_a_resolution_failing_in_the_ends_transaction_keeps_the_end_and_is_tried_again_after_the_commit(monkeypatch):
    wf, step = parked(count=1)
    (job,) = claim_due_jobs(10, claimed_by="test")
    resolve = fanout.resolve_in_ledger
    calls = []

    def fails_first(ledger, step):
        calls.append(step.pk)
        if len(calls) == 1:
            raise RuntimeError("the resolution failed once")
        return resolve(ledger, step)

    monkeypatch.setattr(fanout, "resolve_in_ledger", fails_first)  # in the ends' transaction
    monkeypatch.setattr(locks, "resolve_in_ledger", fails_first)  # after the commit

    assert execute_job(job) == "succeeded"

    assert len(calls) == 2
    assert FanOutJob.objects.get(pk=job.pk).status == "succeeded"
    assert WorkflowStep.objects.get(pk=step.pk).status == "completed"
    assert len(events_of(wf, "step_resolved")) == 1


def test_a_run_another_transaction_holds_does_not_hold_up_the_end_and_is_resolved_after_it():
    wf, step = parked(count=1)
    (job,) = claim_due_jobs(10, claimed_by="test")
    held = HeldRun(wf.record.pk)
    try:
        worker = Worker(execute_job, job)
        worker.start()
        # The end committed without waiting for the run; its resolution waits for the lock.
        eventually(lambda: FanOutJob.objects.filter(pk=job.pk, status="succeeded").exists(), what="the end to commit")
        eventually(held.waiters, what="the resolution to wait for the run's lock")
        assert unresolved() == 1, "the dashboard counts it while it waits"
        assert resolve_lost_fan_outs(timezone.now()) == 0, "the sweep passes over a run another transaction holds"
    finally:
        held.release()
    assert worker.finish() == "succeeded"
    step.refresh_from_db()
    assert step.status == "completed" and wf.reload().status == "ready"
    assert len(events_of(wf, "step_resolved")) == 1
    assert unresolved() == 0


def test_the_next_sweep_pass_resolves_a_fan_out_whose_jobs_all_ended_and_the_dashboard_counts_it_meanwhile():
    wf, step = parked(count=3)
    paused, paused_step = parked(count=1)
    lose_completion(step)
    lose_completion(paused_step)
    paused.pause()
    assert unresolved() == 1, "a paused run's fan-out waits for resume(), it is not counted"

    summary = Sweeper().run()

    assert summary["lost_fan_outs"] == 1
    step.refresh_from_db()
    assert (step.status, step.output) == ("completed", {"total": 3, "succeeded": 3, "failed": 0})
    assert (wf.reload().status, wf.current_step) == ("ready", "after")
    assert unresolved() == 0
    assert paused.reload().status == "paused"
    paused.resume()
    assert (paused.reload().status, paused.current_step) == ("ready", "after"), "resume() resolves it at once"


def test_the_cli_and_the_runs_list_filter_by_the_reason(admin_client):
    wf, step = parked(count=1)
    parked(count=1)  # its job is pending: not stuck
    lose_completion(step)
    out = StringIO()

    call_command("workflows", "list", "--ids", "--stuck", "fan_out_unresolved", stdout=out)

    assert out.getvalue().split() == [str(wf.record.workflow_id)]
    runs_list = reverse("admin:pgbus_workflows_workflowrun_changelist")
    response = admin_client.get(runs_list, {"stuck": "fan_out_unresolved"})
    assert [run.pk for run in response.context["cl"].result_list] == [wf.record.pk]


def test_two_resolvers_waiting_for_the_run_make_one_resolution():
    wf, step = parked(count=2)
    lose_completion(step)
    held = HeldRun(wf.record.pk)
    try:
        # Both saw every job ended before the lock: both wait for it.
        resolvers = [Worker(resolve_if_done, step.pk, wf.record.pk) for _ in range(2)]
        for resolver in resolvers:
            resolver.start()
        eventually(lambda: held.waiters() == 2, what="both resolvers to wait for the run's lock")
    finally:
        held.release()

    assert sorted(resolver.finish() for resolver in resolvers) == [False, True]
    assert resolve_lost_fan_outs(timezone.now()) == 0
    assert len(events_of(wf, "step_resolved")) == 1
    assert wf.reload().current_step == "after"


def test_the_sweep_and_a_last_jobs_resolution_racing_make_one_resolution_each_time():
    def after(barrier, action):
        barrier.wait(timeout=30)
        return action()

    for _ in range(8):
        wf, step = parked(count=1)
        lose_completion(step)
        start = threading.Barrier(2)
        sweep = Worker(after, start, lambda: resolve_lost_fan_outs(timezone.now()))
        last_end = Worker(after, start, lambda step=step, wf=wf: resolve_if_done(step.pk, wf.record.pk))
        sweep.start()
        last_end.start()
        assert int(sweep.finish()) + int(last_end.finish()) == 1
        assert len(events_of(wf, "step_resolved")) == 1
        assert wf.reload().current_step == "after"


def test_the_sweeps_query_reads_the_waiting_steps_and_unfinished_jobs_indexes():
    parked(count=2)
    text, params = ended_fan_outs().values_list("pk", "run_id")[:500].query.sql_with_params()

    with transaction.atomic():  # plan_of's settings are the transaction's
        plan = plan_of((text, list(params)))

    kinds = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan)]
    tables = {n.get("Relation Name") for n in nodes(plan) if n["Node Type"] == "Seq Scan"}
    assert not tables, json.dumps(plan, indent=1)
    assert ("Index Scan", "pgbus_wf_step_waiting") in kinds, json.dumps(plan, indent=1)
    assert ("Index Only Scan", "pgbus_wf_job_unfinished") in kinds, json.dumps(plan, indent=1)


def test_a_pass_resolves_at_most_a_batch():
    for _ in range(3):
        _, step = parked(count=1)
        lose_completion(step)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pgbus_workflows.services.fanout_recovery.BATCH_SIZE", 2)
        assert resolve_lost_fan_outs(timezone.now()) == 2
        assert resolve_lost_fan_outs(timezone.now()) == 1
    assert not WorkflowStep.objects.filter(status="waiting").exists()


def test_an_end_whose_transaction_claims_a_job_of_the_same_fan_out_does_not_look_for_unfinished_jobs(monkeypatch):
    from pgbus_workflows.services.chain import Chain

    _, step = parked(count=3)
    looks = []
    real_unfinished = fanout.unfinished
    monkeypatch.setattr(fanout, "unfinished", lambda step_pk: looks.append(step_pk) or real_unfinished(step_pk))
    chain = Chain(claimed_by="test")
    (job,) = claim_due_jobs(1, claimed_by="test")

    # Each end claims the next job of the fan-out in its own transaction: that job's end will look.
    assert execute_job(job, chain=chain) == "succeeded"
    assert looks == []
    (second,) = chain.take()
    assert execute_job(second, chain=chain) == "succeeded"
    assert looks == []

    # The last end claims nothing of it: it looks, in its transaction, and resolves the fan-out there.
    (last,) = chain.take()
    assert execute_job(last, chain=chain) == "succeeded"
    assert looks and set(looks) == {step.pk}
    assert WorkflowStep.objects.get(pk=step.pk).status == "completed"
    assert chain.take() == []
