"""A dispatcher SIGKILLed between a fan-out's last job end and its resolution, with real processes.

The test holds the run's row lock, so the dispatcher commits the job's end and then waits
for the lock to resolve the fan-out; it is killed there. The next sweep pass of another
dispatcher resolves the fan-out, although ``STALL_THRESHOLD`` is an hour.
"""

import pytest
from django.db import connection

from pgbus_workflows.conf import settings as wf_settings
from pgbus_workflows.models import FanOutJob, WorkflowRun, WorkflowStep
from tests.procs import eventually
from tests.services.test_fanout_recovery import HeldRun, unresolved
from tests.support import events_of, run_next, sessions_waiting_for_a_lock
from tests.testapp.workflows import FanDrain

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FAST = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "DISPATCHER_DEAD_AFTER": 2, "POLL_INTERVAL": 0.2}


def end_waiting_sessions(held: HeldRun) -> None:
    """End the killed dispatcher's session, still waiting for the run's lock on the server.

    A backend waiting for a lock does not read from its client, so PostgreSQL notices the
    client gone only later (``client_connection_check_interval`` is off by default): left
    there, it would take the lock once the test lets it go and run what the dead process had
    already sent. The test is about the resolution that never came, so the session ends here.
    """
    with connection.cursor() as cursor:
        for pid in sessions_waiting_for_a_lock():
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    eventually(lambda: held.waiters() == 0, what="the killed dispatcher's session to end")


def test_a_dispatcher_killed_between_the_last_end_and_the_resolution_leaves_it_to_the_next_sweep(dispatchers):
    wf = FanDrain.start(count=1)
    step = run_next(wf)  # parked: its job is pending
    held = HeldRun(wf.record.pk)
    try:
        victim = dispatchers("--no-sweep", settings=FAST)
        eventually(
            lambda: FanOutJob.objects.filter(step=step, status="succeeded").exists(), what="the job's end to commit"
        )
        eventually(held.waiters, what="the dispatcher's resolution to wait for the run's lock")
        victim.kill()
        end_waiting_sessions(held)
    finally:
        held.release()

    assert wf_settings.STALL_THRESHOLD.total_seconds() == 3600
    assert WorkflowStep.objects.get(pk=step.pk).status == "waiting", victim.output()
    assert unresolved() == 1, "the dashboard counts it while it waits"

    survivor = dispatchers(settings=FAST)
    eventually(
        lambda: WorkflowRun.objects.filter(pk=wf.record.pk, status="finished").exists(),
        timeout=30,
        what="the next sweep pass to resolve the fan-out and the run to finish",
    )
    # The sweep logs what it did once all its phases have run, after the resolution committed.
    eventually(lambda: "lost_fan_outs=1" in survivor.output(), timeout=30, what="the sweep's summary line")
    step.refresh_from_db()
    assert step.output == {"total": 1, "succeeded": 1, "failed": 0}
    assert len(events_of(wf, "step_resolved")) == 1
    assert unresolved() == 0
