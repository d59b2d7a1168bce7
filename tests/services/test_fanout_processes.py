"""Fan-outs drained by real ``run_workflow_dispatcher`` processes: a SIGKILL mid-job, two dispatchers."""

import signal
from collections import Counter

import pytest

from pgbus_workflows.models import Dispatcher, FanOutJob, WorkflowRun, WorkflowStep
from tests.procs import eventually
from tests.testapp.models import SideEffect
from tests.testapp.workflows import FanDrain, FanSleepy

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

#: Short thresholds so a crash is detected in seconds, not the production minute.
FAST = {
    "SWEEP_INTERVAL": 0.5,
    "HEARTBEAT_INTERVAL": 0.5,
    "DISPATCHER_DEAD_AFTER": 2,
    "POLL_INTERVAL": 0.2,
}


def finished(wf):
    return lambda: WorkflowRun.objects.filter(pk=wf.record.pk, status="finished").exists()


def test_a_dispatcher_killed_mid_job_loses_nothing(dispatchers):
    wf = FanSleepy.start(seconds=30, quick=4)
    victim = dispatchers("--no-sweep", "--concurrency", "2", settings=FAST)
    eventually(
        lambda: SideEffect.objects.filter(label="sleepy-start", key="slow").exists(), what="the slow job to start"
    )
    victim_name = FanOutJob.objects.get(index=0).claimed_by
    # Kill it when only the slow job is in flight: a quick job killed mid-run would (rightly) run twice.
    eventually(
        lambda: FanOutJob.objects.filter(index__gt=0, status="succeeded").count() == 4, what="the quick jobs to end"
    )

    victim.kill()

    slow = FanOutJob.objects.get(index=0)
    assert (slow.status, slow.attempts, slow.claimed_by) == ("running", 1, victim_name)
    assert wf.reload().status == "waiting"

    survivor = dispatchers("--concurrency", "2", settings=FAST)
    eventually(finished(wf), timeout=30, what="the run to finish after the crash")

    jobs = list(FanOutJob.objects.order_by("index"))
    assert [j.status for j in jobs] == ["succeeded"] * 5, survivor.output()
    slow = jobs[0]
    assert (slow.attempts, slow.stalls) == (1, 1), "the killed claim is a stall, not an attempt"
    assert "attempt 1 stalled: its dispatcher died" in slow.error
    assert slow.claimed_by != victim_name
    assert SideEffect.objects.filter(label="sleepy-start", key="slow").count() == 2
    assert SideEffect.objects.filter(label="sleepy-end", key="slow").count() == 1
    keys = Counter(SideEffect.objects.filter(label="fan-job").values_list("key", flat=True))
    assert keys == Counter({f"quick-{i}": 1 for i in range(4)})
    fan = WorkflowStep.objects.get(run=wf.record, step_name="work")
    assert fan.output == {"total": 5, "succeeded": 5, "failed": 0}
    after = WorkflowStep.objects.get(run=wf.record, step_name="after")
    assert after.output == {"results": ["slow", "quick-0", "quick-1", "quick-2", "quick-3"]}
    assert not Dispatcher.objects.filter(name=victim_name).exists(), "the dead dispatcher is forgotten"


def test_two_dispatchers_drain_a_300_job_fan_out_and_every_job_runs_once(dispatchers):
    first = dispatchers("--concurrency", "3", settings=FAST)
    second = dispatchers("--concurrency", "3", settings=FAST)
    eventually(lambda: Dispatcher.objects.count() == 2, what="both dispatchers to register")

    # Jobs of 10 ms: one dispatcher alone would need a second, so both take part (quick jobs
    # would all be batched by whichever dispatcher claimed first).
    wf = FanDrain.start(count=300, job_seconds=0.01)
    eventually(finished(wf), timeout=45, what="the 300-job fan-out to drain")

    keys = Counter(SideEffect.objects.filter(label="fan-job").values_list("key", flat=True))
    assert len(keys) == 300 and set(keys.values()) == {1}, "a job ran twice (or not at all)"
    jobs = FanOutJob.objects.all()
    assert set(jobs.values_list("status", "attempts")) == {("succeeded", 1)}
    claimers = set(jobs.values_list("claimed_by", flat=True))
    assert len(claimers) == 2, f"both dispatchers should have run jobs: {claimers}\n{first.output()}{second.output()}"
    fan = WorkflowStep.objects.get(run=wf.record, step_name="drain")
    assert fan.output == {"total": 300, "succeeded": 300, "failed": 0}
    assert WorkflowStep.objects.get(run=wf.record, step_name="after").output == {"n": 300}


def test_a_job_abandoned_at_the_shutdown_timeout_is_put_back_for_the_next_dispatcher(dispatchers):
    wf = FanSleepy.start(seconds=30, quick=0)
    first = dispatchers("--no-sweep", "--shutdown-timeout", "0.5", settings=FAST)
    eventually(
        lambda: SideEffect.objects.filter(label="sleepy-start", key="slow").exists(), what="the slow job to start"
    )

    first.send(signal.SIGTERM)
    assert first.wait() == 0, first.output()
    dispatchers(settings=FAST)

    eventually(finished(wf), timeout=10, what="the abandoned job to run again and the run to finish")
    job = FanOutJob.objects.get()
    assert (job.status, job.attempts, job.stalls) == ("succeeded", 1, 1)
