"""A SIGKILLed dispatcher's step runs again within seconds: its LISTEN session is gone (real processes).

With ``DISPATCHER_DEAD_AFTER`` and ``SWEEP_INTERVAL`` at an hour, only the liveness lock can
tell the death while the test waits: the survivor's heartbeat sees the lock free and the
heartbeat two intervals old, and runs its sweep at once.
"""

import pytest

from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowStep
from tests.procs import eventually
from tests.testapp.workflows import Slow

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SETTINGS = {
    "HEARTBEAT_INTERVAL": 0.5,
    "DISPATCHER_DEAD_AFTER": 3600,
    "SWEEP_INTERVAL": 3600,
    "POLL_INTERVAL": 0.2,
    "STALL_ACTION": "reattempt",
}


def test_a_killed_dispatchers_step_is_reattempted_by_another_long_before_dead_after(dispatchers):
    doomed = dispatchers("--concurrency", "1", "--no-sweep", settings=SETTINGS)
    name = eventually(
        lambda: Dispatcher.objects.filter(session_lock=True).values_list("name", flat=True).first(),
        timeout=60,
        what="the first dispatcher's session to hold its liveness lock",
    )
    wf = Slow.start(seconds=4)
    eventually(
        lambda: WorkflowStep.objects.filter(run=wf.record, status="in_progress", claimed_by=name).exists(),
        timeout=60,
        what="the slow step to run on the doomed dispatcher",
    )
    survivor = dispatchers("--concurrency", "2", settings=SETTINGS)
    eventually(lambda: Dispatcher.objects.count() == 2, timeout=60, what="the survivor to register")

    doomed.kill()
    # The promise is "long before DISPATCHER_DEAD_AFTER": an hour, against this wait's 90 s.
    eventually(lambda: wf.reload().status == "finished", timeout=90, what="the run to finish on the survivor")

    stalled = WorkflowEvent.objects.get(run=wf.record, kind="step_stalled")
    assert (stalled.details["detection"], stalled.details["claimed_by"]) == ("dead_dispatcher", name)
    attempts = list(WorkflowStep.objects.filter(run=wf.record, step_name="work").order_by("pk"))
    assert [(a.outcome, a.claimed_by == name) for a in attempts] == [("stalled", True), ("success", False)]
    assert not Dispatcher.objects.filter(name=name).exists()
    assert "is gone: forgotten" in survivor.output()
