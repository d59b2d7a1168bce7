"""Races around the end of a durable function's fan-out: real threads, real transactions.

The last two jobs ending at once wake the map's checkpoint exactly once; a pause racing the
last job loses nothing, and the resume wakes it exactly once.
"""

import threading

import pytest

from pgbus_workflows import durable
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.fanout import claim_due_jobs, execute_job
from tests.support import events_of, run_next
from tests.testapp import jobs as job_module
from tests.testapp.jobs import meet_pair
from tests.threads import JOIN_TIMEOUT, Worker

pytestmark = pytest.mark.django_db(transaction=True)


@durable(name="race_map", allow_multiple=True)
def race_map(ctx, barrier):
    return ctx.map("pair", meet_pair, [[barrier, 0], [barrier, 1]])


def at_barrier(barrier, work, *args):
    barrier.wait(JOIN_TIMEOUT)
    return work(*args)


def finish(run):
    """Run the function on to its end (each attempt claimed and executed as a dispatcher would)."""
    while run.reload().status == "ready":
        run_next(run)
    return run


def test_the_last_two_jobs_ending_at_once_wake_the_map_exactly_once():
    for round_ in range(10):
        name = f"durable-race-{round_}"
        job_module.BARRIERS[name] = threading.Barrier(2)
        try:
            run = race_map.start(None, barrier=name)
            run_next(run)
            claimed = claim_due_jobs(2, claimed_by="test")
            assert len(claimed) == 2
            barrier = threading.Barrier(2)
            workers = [Worker(at_barrier, barrier, execute_job, job) for job in claimed]
            for worker in workers:
                worker.start()
            statuses = [worker.finish() for worker in workers]
        finally:
            job_module.BARRIERS.pop(name, None)
        assert statuses == ["succeeded", "succeeded"], f"round {round_}"
        assert len(events_of(run, "fan_out_ended")) == 1, f"round {round_}: woken twice"
        assert (run.reload().status, run.record.current_step) == ("ready", "pair"), f"round {round_}"
        assert finish(run).status == "finished", f"round {round_}"
        assert run.result() == [0, 1]
        assert WorkflowStep.objects.filter(run=run.record, step_name="pair").count() == 1, f"round {round_}"


def test_a_pause_racing_the_last_job_loses_nothing_and_the_resume_wakes_the_map_once():
    for round_ in range(10):
        run = race_map.start(None, barrier="none")
        run_next(run)
        claimed = claim_due_jobs(2, claimed_by="test")
        execute_job(claimed[0])
        barrier = threading.Barrier(2)
        finisher = Worker(at_barrier, barrier, execute_job, claimed[1])
        pauser = Worker(at_barrier, barrier, run.pause)
        finisher.start()
        pauser.start()
        assert finisher.finish() == "succeeded"
        pauser.finish()
        assert run.reload().status == "paused", f"round {round_}"
        run.resume()
        assert len(events_of(run, "fan_out_ended")) == 1, f"round {round_}"
        assert finish(run).status == "finished", f"round {round_}"
        assert run.result() == [0, 1]
