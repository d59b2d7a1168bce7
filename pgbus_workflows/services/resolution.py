"""A fan-out's resolution under its run's lock, once its members (jobs or child runs) have all ended.

Success when none failed (or ``on_job_failure`` says to go on), else ``FanOutFailed`` goes to
the exception policy; a fan-out of a durable function wakes its body instead. Whoever
takes the lock (``locks.resolve_if_done``, the jobs' end, an operator's resume) calls
:func:`resolve_in_ledger`, which re-checks: exactly one resolution wins.
"""

from __future__ import annotations

from django.db.models import Count

from ..exceptions import FanOutFailed
from ..models import UNFINISHED_JOB, FanOutJob, JobStatus, WorkflowStep
from ..states import RunStatus, StepStatus
from . import waiting
from .children import CHILD_PREFIX
from .ledger import RunLedger
from .outcome import StepOutcome


def unfinished(step_pk: int) -> bool:
    """True while any job of the fan-out is pending or running (stops at the first: indexed)."""
    return FanOutJob.objects.filter(step_id=step_pk, status__in=UNFINISHED_JOB).exists()


def resolve_in_ledger(ledger: RunLedger, step: WorkflowStep) -> bool:
    """Under the run lock: resolve a waiting fan-out whose jobs all ended (a paused run waits for resume)."""
    if step.status != StepStatus.WAITING or step.fan_out_total is None:
        return False
    if ledger.run.status != RunStatus.WAITING or unfinished(step.pk):
        return False
    counts, definition = progress(step), ledger.cls.step_definition(step.step_name)
    summary = {"total": counts["total"], "succeeded": counts["succeeded"], "failed": counts["failed"]}
    if definition is not None and definition.on_job_failure == "run":  # the body reads the ends (a durable function)
        waiting.wake(ledger, step, kind="fan_out_ended", details={"fan_out": summary})
        return True
    members = "children" if step.jobs.filter(function__startswith=CHILD_PREFIX).exists() else "jobs"
    if counts["failed"] and (definition is None or definition.on_job_failure == "fail"):
        error = FanOutFailed(f"{counts['failed']} of {counts['total']} {members} of {step.step_name} failed")
        outcome = StepOutcome.from_error(error, details={"fan_out": summary})
    else:
        # The output the body kept is the step's; without one, the counts are.
        output = summary if step.output is None else step.output
        outcome = StepOutcome("success", output=output, details={"fan_out": summary})
    waiting.resolve(ledger, step, outcome)
    return True


def progress(step: WorkflowStep) -> dict[str, int]:
    """``{"total", "succeeded", "failed", "cancelled", "pending"}`` for a fan-out attempt."""
    rows = FanOutJob.objects.filter(step_id=step.pk).values_list("status").annotate(n=Count("pk")).order_by()
    by_status = dict(rows)
    return {
        "total": step.fan_out_total or 0,
        "succeeded": by_status.get(JobStatus.SUCCEEDED, 0),
        "failed": by_status.get(JobStatus.FAILED, 0),
        "cancelled": by_status.get(JobStatus.CANCELLED, 0),
        "pending": by_status.get(JobStatus.PENDING, 0) + by_status.get(JobStatus.RUNNING, 0),
    }
