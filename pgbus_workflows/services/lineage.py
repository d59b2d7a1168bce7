"""A child run's end, written into its parent's fan-out: the job that stands for it, and a wake-up.

The ledger of the child's last transition calls :func:`child_end` under the child's lock
and writes the job row it returns with the rest of its unit of work (batched with the other
outcomes of a dispatcher's batch). The child's result (or why it was cancelled) goes on the
parent's fan-out job row, never on the parent's run row: locks are only ever taken parent
first (a parent's cancel locks its children), so the child's transaction must not wait for
its parent. The ledger keeps the job's pk, and the lock block that made the ledger resolves
the parent's step once that transaction commits, in one of its own
(``locks.resolve_if_done``); the sweep resolves one whose resolution was lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models import FanOutJob, WorkflowRun, WorkflowStep
from ..sql import rows
from ..states import JobStatus, RunStatus, StepOutcomeKind
from .payload import storable_text

if TYPE_CHECKING:
    from ..sql.bulk import WriteBatch

#: The job columns a child's end writes.
END_FIELDS = ("status", "finished_at", "result", "error")


def run_result(run: WorkflowRun, step: WorkflowStep | None = None) -> Any:
    """A run's result: the output of its last completed step (``finished(result)`` records it there).

    ``step``: the attempt that ended the run in this unit of work, maybe not written yet.
    """
    if step is not None and step.outcome == StepOutcomeKind.SUCCESS:
        return step.output
    latest = WorkflowStep.objects.filter(run_id=run.pk, outcome=StepOutcomeKind.SUCCESS).order_by("-id")
    if step is not None and step.pk is not None:
        latest = latest.exclude(pk=step.pk)
    return next(iter(latest.values_list("output", flat=True)[:1]), None)


def child_end(
    run: WorkflowRun, status: str, step: WorkflowStep | None, reason: str | None, now: Any
) -> FanOutJob | None:
    """The parent's job row of the child ``run`` that ended, as it must now be written (None: not a child).

    Finished is the job's success, with the child's result; cancelled is its failure.
    """
    if run.parent_job_id is None:
        return None
    if status == RunStatus.FINISHED:
        return rows.build(
            FanOutJob, id=run.parent_job_id, status=JobStatus.SUCCEEDED, finished_at=now, result=run_result(run, step)
        )
    why = f": {reason}" if reason else ""
    error = storable_text(f"Child run {run.workflow_id} ({run.workflow_class}) was cancelled{why}")
    return rows.build(FanOutJob, id=run.parent_job_id, status=JobStatus.FAILED, finished_at=now, error=error)


def end_parent_job(
    run: WorkflowRun,
    status: str,
    step: WorkflowStep | None,
    reason: str | None,
    now: Any,
    writes: WriteBatch | None,
) -> int | None:
    """A child run that ended: its parent's job learns it (written with ``writes``, or now).

    Returns the job's pk, whose fan-out is to be resolved once this commits (None: not a child).
    """
    job = child_end(run, status, step, reason, now)
    if job is None:
        return None
    if writes is not None:
        writes.update(job, END_FIELDS)
    else:
        rows.update(job, END_FIELDS)
    return job.pk
