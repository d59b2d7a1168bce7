"""Child runs of a fan-out step: started in the transaction that parks the step, each at most once.

Each child has a fan-out job row in the parent's step that stands for it (its end is
recorded there by ``services.lineage``), so the parent's step resolves, counts and reads
results as it does for jobs. A child's idempotency key defaults to one made of the parent
run, the step and the child's index: a reattempt of the step (or a body run again after a
crash) finds the children started before and re-attaches them, never starting a second.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..conf import settings
from ..exceptions import ChildConflict, ChildDepthExceeded
from ..models import FanOutJob, WorkflowRun, WorkflowStep
from ..sql import rows
from ..states import TERMINAL_RUN, JobStatus
from .ledger import RunLedger
from .lineage import END_FIELDS, child_end
from .start import MAX_KEY_LENGTH, Checked, start_children

if TYPE_CHECKING:
    from .handle import RunHandle

#: The job ``function`` of a child (informational: the child run's class is what runs).
CHILD_PREFIX = "child:"


@dataclass
class ChildStart:
    """One checked ``Child`` of a fan-out body: its class, its start and its parent-close policy."""

    cls: type[RunHandle]
    checked: Checked
    parent_close: str


def child_key(parent: WorkflowRun, step_name: str, index: int) -> str:
    """The default idempotency key of the child at ``index`` of ``step_name`` in ``parent``."""
    key = f"child:{parent.workflow_id}:{step_name}:{index}"
    if len(key) > MAX_KEY_LENGTH:
        digest = hashlib.sha256(step_name.encode()).hexdigest()
        key = f"child:{parent.workflow_id}:{digest}:{index}"
    return key


def open_children(ledger: RunLedger, step: WorkflowStep, children: list[ChildStart]) -> int:
    """Insert the step's jobs and start (or re-attach) its children; returns how many have ended already.

    Runs under the parent's lock, in the transaction that parks the step: a crash before its
    commit leaves neither. Children of the same class are started with one statement per table.
    """
    now = ledger.now
    jobs = [
        FanOutJob(
            step=step,
            run=ledger.run,
            index=index,
            function=f"{CHILD_PREFIX}{child.cls.name}"[:255],
            arguments={},
            status=JobStatus.RUNNING,
            attempts=1,
            max_attempts=1,
            queue=step.queue,
            priority=step.priority,
            scheduled_at=now,
            started_at=now,
        )
        for index, child in enumerate(children)
    ]
    FanOutJob.objects.bulk_create(jobs, batch_size=1000)
    by_class: dict[type[RunHandle], list[int]] = {}
    for index, child in enumerate(children):
        by_class.setdefault(child.cls, []).append(index)
    actor = f"parent:{ledger.run.workflow_id}"
    ended = 0
    for cls, indexes in by_class.items():
        lineages = [
            {
                "parent": ledger.run,
                "parent_job_id": jobs[i].pk,
                "parent_close": children[i].parent_close,
                "depth": ledger.run.depth + 1,
                "trace_context": ledger.run.trace_context,
            }
            for i in indexes
        ]
        handles = start_children(cls, [children[i].checked for i in indexes], lineages, actor)
        for i, handle in zip(indexes, handles, strict=True):
            if handle.duplicate_start:
                ended += _reattach(ledger, jobs[i], handle.record)
            elif handle.record.status in TERMINAL_RUN:  # a class with no steps finished at once
                ended += 1
    return ended


def _reattach(ledger: RunLedger, job: FanOutJob, existing: WorkflowRun) -> int:
    """A child this step started before (a reattempt): its job is now ``job``; 1 when it has ended."""
    child = rows.lock(WorkflowRun, {"id": existing.pk})  # parent first, then child: the order a cancel takes
    if (
        child is None
        or child.parent_id != ledger.run.pk
        or _step_of(child.parent_job_id) not in (None, job.step.step_name)
    ):
        raise ChildConflict(
            f"idempotency_key {existing.idempotency_key!r} of {existing.workflow_class} is taken by run "
            f"{existing.workflow_id}, which is not a child of step {job.step.step_name} of {ledger.run.workflow_id}: "
            "use a key per child"
        )
    WorkflowRun.objects.filter(pk=child.pk).update(parent_job_id=job.pk)
    if child.parent_job_id is not None:  # its job in the earlier attempt no longer stands for it
        FanOutJob.objects.filter(pk=child.parent_job_id, status=JobStatus.RUNNING).update(
            status=JobStatus.CANCELLED, finished_at=ledger.now
        )
    ledger.event("child_reattached", details={"child": str(child.workflow_id), "index": job.index})
    if child.status not in TERMINAL_RUN:
        return 0
    child.parent_job_id = job.pk
    ended = child_end(child, child.status, None, None, ledger.now)  # as its end was written the first time
    if ended is not None:
        rows.update(ended, END_FIELDS)
    return 1


def _step_of(job_pk: int | None) -> str | None:
    """The step name of the fan-out job ``job_pk`` (None when there is none)."""
    names = FanOutJob.objects.filter(pk=job_pk).values_list("step__step_name", flat=True) if job_pk else []
    return next(iter(names), None)


def check_depth(parent: WorkflowRun) -> None:
    """Refuse children deeper than ``MAX_CHILD_DEPTH`` (a workflow that starts itself without end)."""
    limit = settings.MAX_CHILD_DEPTH
    if parent.depth + 1 > limit:
        raise ChildDepthExceeded(
            f"Run {parent.workflow_id} ({parent.workflow_class}) is at depth {parent.depth}: its children would "
            f"pass MAX_CHILD_DEPTH ({limit}). A workflow that starts children of its own class needs an end."
        )
