"""A fork against the original's own moves, with real threads on PostgreSQL.

The fork takes the original's run lock, as every verb does, so it waits for a pause or a
resume in progress (and they wait for it), and neither deadlocks: each ends as if the
other had come first.
"""

import threading

import pytest
from django.db import transaction

from pgbus_workflows import Workflow, step
from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.services import forking, operator
from tests.procs import eventually
from tests.support import events_of, kinds, run_next, sessions_waiting_for_a_lock
from tests.threads import JOIN_TIMEOUT, Worker

pytestmark = pytest.mark.django_db(transaction=True)

HELD = threading.Event()
RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def _gates():
    HELD.clear()
    RELEASE.clear()
    yield
    RELEASE.set()  # never leave a thread holding a lock


class RaceFork(Workflow):
    name = "race_fork"
    allow_multiple = True

    @step
    def first(self):
        return {"n": 1}

    @step
    def second(self):
        return None


def holding(verb, pk):
    """Call ``verb`` on run ``pk`` in a transaction kept open (its run lock held) until RELEASE."""
    with transaction.atomic():
        verb(pk, actor="alice", reason="holding")
        HELD.set()
        assert RELEASE.wait(JOIN_TIMEOUT), "the test never released the lock"


def started_at_second():
    """A paused run of RaceFork whose first step completed."""
    wf = RaceFork.start(None)
    run_next(wf)
    wf.pause(reason="before the race")
    return wf


@pytest.mark.parametrize(("verb", "status"), [(operator.resume, "ready"), (operator.pause, "paused")])
def test_a_fork_waits_for_a_move_of_the_original_in_progress(verb, status):
    wf = started_at_second()
    if verb is operator.pause:
        wf.resume()
    holder = Worker(holding, verb, wf.record.pk)
    holder.start()
    assert HELD.wait(JOIN_TIMEOUT)

    forker = Worker(forking.fork, wf.record.pk, "second")
    forker.start()
    eventually(sessions_waiting_for_a_lock, what="fork() waiting for the original's run lock")
    assert forker.is_alive(), "the fork went ahead while the original's lock was held"
    assert not WorkflowRun.objects.filter(forked_from=wf.workflow_id).exists()

    RELEASE.set()
    holder.finish()
    fork = forker.finish()

    assert fork.forked_from == wf.workflow_id and fork.current_step == "second"
    assert wf.reload().status == status
    moved, forked = kinds(wf)[-2:]
    assert (moved, forked) == ("resumed" if verb is operator.resume else "paused", "forked")


def test_a_pause_waits_for_a_fork_in_progress():
    wf = started_at_second()
    wf.resume()
    holder = Worker(holding, lambda pk, **audit: forking.fork(pk, "second", **audit), wf.record.pk)
    holder.start()
    assert HELD.wait(JOIN_TIMEOUT)

    pauser = Worker(operator.pause, wf.record.pk)
    pauser.start()
    eventually(sessions_waiting_for_a_lock, what="pause() waiting for the run lock the fork holds")
    assert pauser.is_alive()

    RELEASE.set()
    holder.finish()
    pauser.finish()

    assert wf.reload().status == "paused"
    assert [e.kind for e in events_of(wf)][-2:] == ["forked", "paused"]
    assert WorkflowRun.objects.get(forked_from=wf.workflow_id).status == "ready"
