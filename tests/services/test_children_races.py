"""Child workflows under races: a parent cancelled while its children end, a child ending while its parent resolves.

Locks are only ever taken parent first (a parent's cancel locks its children; a child's end
writes its parent's job row, not its parent's run): whatever the interleaving, nothing
deadlocks, every child ends once, and each job row says how its child ended.
"""

import threading

import pytest

from pgbus_workflows.models import FanOutJob, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_step
from pgbus_workflows.services.executor import execute_step
from tests.support import run_next
from tests.testapp.child_workflows import Many
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)

JOB_FOR = {"finished": "succeeded", "cancelled": "failed"}


def claimed_children(parent):
    return [claim_step(WorkflowStep.objects.get(run_id=child.record.pk).pk, "race") for child in parent.children]


def finish_all(barrier, steps):
    barrier.wait()
    for step in steps:
        execute_step(step)


def cancel(barrier, workflow_id):
    barrier.wait()
    Many.find(workflow_id).cancel("race")


def test_a_parent_cancelled_while_its_children_end_deadlocks_nothing_and_loses_nothing():
    for _ in range(8):
        parent = Many.start(count=4)
        run_next(parent)
        claimed = claimed_children(parent)
        barrier = threading.Barrier(3)

        workers = [
            Worker(finish_all, barrier, claimed[:2]),
            Worker(finish_all, barrier, claimed[2:]),
            Worker(cancel, barrier, parent.workflow_id),
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.finish()  # re-raises a deadlock (PostgreSQL aborts one of a deadlocked pair)

        assert parent.reload().status == "cancelled"
        children = list(WorkflowRun.objects.filter(parent_id=parent.record.pk))
        assert {child.status for child in children} <= {"finished", "cancelled"}
        for child in children:
            assert FanOutJob.objects.get(pk=child.parent_job_id).status == JOB_FOR[child.status], child


def test_the_last_two_children_ending_at_once_resolve_their_parent_exactly_once():
    for _ in range(8):
        parent = Many.start(count=2)
        run_next(parent)
        claimed = claimed_children(parent)
        barrier = threading.Barrier(2)

        workers = [Worker(finish_all, barrier, [step]) for step in claimed]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.finish()

        parent.reload()
        assert parent.status == "ready"  # resolved: its next step is scheduled
        resolved = WorkflowStep.objects.filter(run_id=parent.record.pk, step_name="spawn", outcome="success")
        assert resolved.count() == 1
        assert WorkflowStep.objects.filter(run_id=parent.record.pk, step_name="total").count() == 1
        run_next(parent)
        assert parent.result(timeout=5) == 0 + 1
