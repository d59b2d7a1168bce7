"""The sweep's side of fan-outs: jobs whose dispatcher stalled or died, fan-outs left unresolved.

A job's end and its fan-out's resolution are one transaction when the run's lock is free
(``fanout.record_job_ends``); otherwise the resolution follows the commit, and a dispatcher
killed in between leaves a waiting fan-out whose jobs have all ended. The sweep resolves
such a fan-out at its next pass, under the run's lock, as the last job would have.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial

from django.db.models import Exists, F, OuterRef, QuerySet

from ..conf import settings
from ..models import UNFINISHED_JOB, FanOutJob, JobStatus, WorkflowStep
from ..sql import clock
from ..states import RunStatus, StepStatus, job_event
from .fanout import BATCH_SIZE, finish_attempt
from .isolation import RowFailures
from .locks import resolve_if_done


def recover_jobs(now: datetime, dead: list[str] | None = None, failures: RowFailures | None = None) -> int:
    """Put back running jobs past their ``stall_at`` (or of dead dispatchers) to run again.

    Each job on its own (``failures``): one that cannot be put back is passed over.
    """
    failures = failures or RowFailures()
    running = FanOutJob.objects.filter(status=JobStatus.RUNNING).exclude(pk__in=failures.passed_over("stalled_jobs"))
    running = running.filter(claimed_by__in=dead) if dead is not None else running.filter(stall_at__lt=now)
    recovered = 0
    for job in running.select_related("step", "run").order_by("pk")[:BATCH_SIZE]:
        recovered += failures.act("stalled_jobs", job.pk, job.run_id, partial(_recover_job, job, dead is not None))
    return recovered


def _recover_job(job: FanOutJob, dead: bool) -> bool:
    """Put a stalled job back (the claim is not an attempt: it may never have started).

    After ``MAX_STALLS`` stalls (a job that takes its dispatcher down every time), or once
    its fan-out no longer waits, it fails instead.
    """
    why = "its dispatcher died" if dead else f"it ran past its stall_at {job.stall_at}"
    error = f"Job {job.function} #{job.index} attempt {job.attempts} stalled: {why}"
    limit = settings.MAX_STALLS
    if limit is None or job.stalls < limit:
        source, target = job_event("put_back")
        put_back = FanOutJob.objects.filter(
            pk=job.pk, status=source, attempts=job.attempts, step__status=StepStatus.WAITING
        ).update(
            status=target,
            attempts=F("attempts") - 1,
            stalls=F("stalls") + 1,
            error=error,
            scheduled_at=clock.now(),
            stall_at=None,
        )
        if put_back:
            return True
    else:
        error += f" ({job.stalls + 1} stalls: MAX_STALLS is {limit})"
    if finish_attempt(job, JobStatus.FAILED, error=error):
        resolve_if_done(job.step_id, job.run_id, skip_locked=True)
    return True


def ended_fan_outs() -> QuerySet[WorkflowStep]:
    """Waiting fan-outs of waiting runs with no job left pending or running: each awaits its resolution.

    Read through the waiting steps' partial index and, per step, the unfinished jobs' partial
    index (``tests/services/test_fanout_recovery.py`` checks the plan), so the cost follows the fan-outs
    waiting now, not the history. A paused run's fan-out is left for ``resume()``.
    """
    open_jobs = FanOutJob.objects.filter(step_id=OuterRef("pk"), status__in=UNFINISHED_JOB)
    return WorkflowStep.objects.filter(
        ~Exists(open_jobs), status=StepStatus.WAITING, fan_out_total__isnull=False, run__status=RunStatus.WAITING
    )


def resolve_lost_fan_outs(now: datetime, failures: RowFailures | None = None) -> int:
    """The sweep phase: resolve (at most ``BATCH_SIZE``) waiting fan-outs whose jobs have all ended.

    No wait: a fan-out that a concurrent job end resolves first is found resolved under the
    run's lock, and a run another transaction holds is passed over until the next pass.
    """
    failures = failures or RowFailures()
    steps = ended_fan_outs().exclude(pk__in=failures.passed_over("lost_fan_outs")).values_list("pk", "run_id")
    return sum(
        failures.act("lost_fan_outs", step_pk, run_pk, partial(resolve_if_done, step_pk, run_pk, skip_locked=True))
        for step_pk, run_pk in steps[:BATCH_SIZE]
    )
