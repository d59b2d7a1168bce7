"""Fan-out jobs: claimed and run by the dispatchers like steps; the last one resolves the step.

A fan-out step's body returns ``Job`` objects; ``apply_outcome`` inserts them in bulk in the
transaction that parks the step. Each job is claimed with ``SKIP LOCKED``, runs with its
own attempts and backoff, and ends succeeded or failed. Whoever finishes a job and finds no
unfinished job left resolves the step under the run lock, in the transaction that records
the end when the run's lock is free, else right after its commit; the lock and the re-check
make exactly one resolution win. The sweep (``fanout_recovery``) resolves at its next pass a
fan-out whose jobs all ended but whose resolution was lost (its dispatcher died in between).
"""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import connection, transaction

from .. import sql
from ..conf import settings
from ..dsl.definitions import resolve_wait
from ..dsl.deploy import can_run_job
from ..dsl.jobs import resolve_job, stored_backoff
from ..models import FanOutJob, JobStatus, WorkflowRun, WorkflowStep
from ..sql import clock, rows
from ..states import StepStatus, job_event
from .body import Awaiting
from .chain import Chain
from .handle import handle_class
from .locks import RunLocked, locked_step, resolve_if_done
from .payload import encode_payload, storable_text
from .resolution import resolve_in_ledger, unfinished
from .transactions import CONNECTION_ERRORS, commit_once, with_reconnect

logger = logging.getLogger("pgbus_workflows")

BATCH_SIZE = 500


def claim_due_jobs(limit: int, queues: Iterable[str] | None = None, claimed_by: str = "") -> list[FanOutJob]:
    """Claim up to ``limit`` due pending jobs (``SKIP LOCKED``), by priority then ``scheduled_at``.

    A job whose function this process cannot import is left for a dispatcher with newer code
    for ``UNKNOWN_STEP_GRACE``; after that, any dispatcher claims it and it fails, as it would.
    """
    if limit < 1:
        return []
    now = clock.now()
    cutoff = now - settings.UNKNOWN_STEP_GRACE
    own_transaction = not transaction.get_connection().in_atomic_block
    with transaction.atomic():
        for attempt in range(5):
            # tuple(): a copy made at once, as worker threads claim jobs too (the set may grow meanwhile)
            unknown = sorted(path for path in tuple(_unimportable) if not can_run_job(path))
            in_index_order = own_transaction and attempt == 0  # a setting that lasts until the commit
            found = _due_jobs(limit, None if queues is None else list(queues), now, cutoff, unknown, in_index_order)
            new = {path for _, path, at in found if at > cutoff and not can_run_job(path)}
            if not new:
                break
            _unimportable.update(new)
        ids = [pk for pk, path, at in found if at <= cutoff or can_run_job(path)]
        return _start(ids, now, claimed_by)


#: Job functions this process was offered and cannot import (left out of later claims).
_unimportable: set[str] = set()


def _due_jobs(
    limit: int, queues: list[str] | None, now: datetime, cutoff: datetime, unknown: list[str], in_index_order: bool
) -> list[tuple[int, str, datetime]]:
    """``(id, function, scheduled_at)`` of due pending jobs, locked; ``unknown`` functions left out until ``cutoff``.

    ``in_index_order``: the claim's own transaction plans it without bitmap scans from now on
    (``sql.fetch_in_index_order``), as a step's claim is planned.
    """
    if not sql.postgresql():  # SQLite: one process writes at a time, there is nothing to skip
        due = FanOutJob.objects.filter(status=JobStatus.PENDING, scheduled_at__lte=now)
        if queues is not None:
            due = due.filter(queue__in=queues)
        if unknown:
            due = due.exclude(function__in=unknown, scheduled_at__gt=cutoff)
        due = due.order_by("priority", "scheduled_at", "pk")
        return list(due.values_list("pk", "function", "scheduled_at")[:limit])
    params: list[Any] = [now, *([] if queues is None else [queues]), *([unknown, cutoff] if unknown else [])]
    text = sql.statement("due_jobs", queues is not None, bool(unknown))
    params += [limit, limit]  # a priority's, the claim's
    if in_index_order:
        return [(pk, path, at) for pk, path, at in sql.fetch_in_index_order(text, params)]
    with sql.cursor() as cursor:
        cursor.execute(text, params)
        return [(pk, path, at) for pk, path, at in cursor.fetchall()]


def claim_job(job_pk: int, claimed_by: str = "") -> FanOutJob | None:
    """Claim one pending job whatever its ``scheduled_at`` (the test helpers); None when it is not pending."""
    with transaction.atomic():
        locked = FanOutJob.objects.select_for_update().filter(pk=job_pk, status=JobStatus.PENDING).values_list("pk")
        ids = [pk for (pk,) in locked]
        claimed = _start(ids, clock.now(), claimed_by)
    return claimed[0] if claimed else None


def _start(ids: list[int], now: datetime, claimed_by: str) -> list[FanOutJob]:
    """Move the locked pending jobs to running (one statement on PostgreSQL), in claim order."""
    if not ids:
        return []
    if not sql.postgresql():
        source, target = job_event("claim")
        jobs = list(FanOutJob.objects.select_related("step").filter(pk__in=ids, status=source))
        for job in jobs:
            job.status = target
            job.attempts += 1
            job.started_at = now
            job.claimed_by = claimed_by
            job.stall_at = now + (job.step.timeout or settings.STALL_THRESHOLD)
        FanOutJob.objects.bulk_update(jobs, ["status", "attempts", "started_at", "claimed_by", "stall_at"])
    else:
        with sql.pipeline() as cursor:
            cursor.execute(sql.statement("start_jobs"), [now, claimed_by, now, settings.STALL_THRESHOLD, ids])
            jobs = [rows.from_row(FanOutJob, row) for row in cursor.fetchall()]
    order = {pk: n for n, pk in enumerate(ids)}
    return sorted(jobs, key=lambda job: order[job.pk])


@dataclass
class JobEnd:
    """How one attempt of a job ended: its encoded result, or the formatted error."""

    job: FanOutJob
    result: Any = None
    error: str | None = None


def execute_job(job: FanOutJob, *, chain: Chain | None = None) -> str:
    """Run a claimed job and record how it ended; resolve the step when it was the last. Returns the status.

    With a ``chain``, the transaction that records the end also claims this worker's next
    due job (``chain.next_jobs``). Recording is retried when the database connection drops,
    so a job that ran is not left running.
    """
    return record_job_ends([run_job(job)], chain)[0]


def run_job(job: FanOutJob) -> JobEnd:
    """Call a claimed job's function; never raises (an error is kept in the ``JobEnd``).

    Every exception counts, ``SystemExit`` and ``KeyboardInterrupt`` included: a job ends in
    one recorded end, and the worker thread lives on. An ``async def`` function is awaited here.
    """
    started = start_job(job)
    return started.run_here() if isinstance(started, Awaiting) else started


def start_job(job: FanOutJob) -> JobEnd | Awaiting[JobEnd]:
    """Call a claimed job's function: its end, or, for an ``async def`` function, its coroutine to await."""
    try:
        function = resolve_job(job.function)
        value = function(*job.arguments.get("args", []), **job.arguments.get("kwargs", {}))
    except BaseException as error:
        return _job_end(job, None, error)
    if inspect.isawaitable(value):
        return Awaiting(value, None, f"job {job.function} #{job.index} of step {job.step_id}", partial(_job_end, job))
    return _job_end(job, value, None)


def _job_end(job: FanOutJob, value: Any, error: BaseException | None) -> JobEnd:
    if error is None:
        try:
            return JobEnd(job, result=encode_payload(value, f"result of job {job.function} #{job.index}"))
        except BaseException as raised:
            error = raised
    return JobEnd(job, error=_formatted(error))


def _formatted(error: BaseException) -> str:
    return storable_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))


def record_job_ends(ends: Sequence[JobEnd], chain: Chain | None = None) -> list[str]:
    """Record several jobs' ends in one transaction; resolve each fan-out whose last job ended.

    Returns each job's status: succeeded, failed, pending (retried after its backoff), or
    "" when its attempt was no longer running (cancelled or put back meanwhile). With a
    ``chain``, the same transaction claims as many due jobs for this worker (handed over only
    once that transaction is known to have committed). Should the batch fail, each end is
    recorded alone; a result that cannot be written fails its job with the error that
    stopped it, so one bad end never costs the others.
    """
    try:
        statuses, settled, claimed = commit_once(partial(_record, ends, chain))
    except CONNECTION_ERRORS:
        raise
    except Exception as error:
        if len(ends) > 1:
            logger.exception("Recording %d job ends together failed; recording them one by one", len(ends))
            return [status for end in ends for status in record_job_ends([end], chain)]
        if ends[0].error is not None:
            raise
        logger.error("The result of job %s could not be written (%s); failing the job", ends[0].job.pk, error)
        return record_job_ends([JobEnd(ends[0].job, error=_formatted(error))], chain)
    if chain is not None:
        chain.next_jobs.extend(claimed)
    for step_pk, run_pk in sorted(_ended(ends, statuses) - settled):
        with_reconnect(partial(resolve_if_done, step_pk, run_pk))
    return statuses


def _record(ends: Sequence[JobEnd], chain: Chain | None) -> tuple[list[str], set[tuple[int, int]], list[FanOutJob]]:
    """The transaction of :func:`record_job_ends`: the ends, the next jobs' claims, the fan-outs settled.

    A fan-out of which this transaction claims a job is settled without a look: that job is
    unfinished, and its own end looks again. In a drain that is every end but the last few,
    so the look (and the one after the commit) is paid near a fan-out's end only.
    """
    succeeded = _finish_many([end for end in ends if end.error is None])
    statuses = [_fail(end.job, end.error) if end.error is not None else succeeded.get(end.job.pk, "") for end in ends]
    claimed: list[FanOutJob] = []
    if chain is not None and not (chain.stop is not None and chain.stop.is_set()):
        claimed = claim_due_jobs(len(ends), chain.queues, chain.claimed_by)
    ended = _ended(ends, statuses)
    going_on = ended & {(job.step_id, job.run_id) for job in claimed}
    return statuses, going_on | _settle_in_transaction(ended - going_on), claimed


def _ended(ends: Sequence[JobEnd], statuses: Sequence[str]) -> set[tuple[int, int]]:
    """``(step pk, run pk)`` of the fan-outs a job of ``ends`` ended in (succeeded or failed)."""
    return {(end.job.step_id, end.job.run_id) for end, status in zip(ends, statuses, strict=True) if status in _FINAL}


def _settle_in_transaction(ended: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Resolve, in the transaction of the jobs' ends, each fan-out of ``ended`` with no job left.

    So a dispatcher dying after the commit leaves no fan-out to resolve. Returns the fan-outs
    settled here (resolved, or found with nothing to resolve under their run lock). The others
    are resolved after the commit: a run another transaction holds is not waited for (this
    transaction holds job rows its holder may be about to write), a job ending at the same
    time in another transaction still looks unfinished here, and an error here is rolled back
    to a savepoint and met again after the commit, as it was before.
    """
    settled: set[tuple[int, int]] = set()
    for step_pk, run_pk in sorted(ended):
        if unfinished(step_pk):
            continue
        try:
            with locked_step(run_pk, step_pk, skip_locked=True) as (ledger, step):
                if step is not None:
                    resolve_in_ledger(ledger, step)
        except RunLocked:
            continue
        except CONNECTION_ERRORS:
            raise
        except WorkflowRun.DoesNotExist:
            pass  # deleted meanwhile: nothing is left to resolve
        except Exception:
            logger.exception(
                "Resolving fan-out step %s with its last job's end failed; trying after the commit", step_pk
            )
            continue
        settled.add((step_pk, run_pk))
    return settled


_FINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED)


def _finish_many(ends: list[JobEnd]) -> dict[int, str]:
    """Record succeeded attempts still running (one statement); ``{job pk: "succeeded"}`` for those."""
    if not ends:
        return {}
    if not sql.postgresql() or len(ends) == 1:
        return {
            e.job.pk: JobStatus.SUCCEEDED for e in ends if finish_attempt(e.job, JobStatus.SUCCEEDED, result=e.result)
        }
    result_field = FanOutJob._meta.get_field("result")
    results = [result_field.get_db_prep_save(end.result, connection) for end in ends]
    with sql.pipeline() as cursor:
        params = [clock.now(), [e.job.pk for e in ends], [e.job.attempts for e in ends], results]
        cursor.execute(sql.statement("record_job_successes"), params)
        return {pk: JobStatus.SUCCEEDED for (pk,) in cursor.fetchall()}


def finish_attempt(job: FanOutJob, status: str, **fields: Any) -> bool:
    """Record the end of a running attempt; False when it was cancelled or put back meanwhile."""
    source, target = job_event("succeed" if status == JobStatus.SUCCEEDED else "fail")
    updated = FanOutJob.objects.filter(pk=job.pk, status=source, attempts=job.attempts).update(
        status=target, finished_at=clock.now(), stall_at=None, **fields
    )
    return updated == 1


def _fail(job: FanOutJob, error: str) -> str:
    """Retry after the backoff while attempts remain; else the job fails with its error kept."""
    error = storable_text(error)
    if job.attempts < job.max_attempts:
        definition = handle_class(job.run.workflow_class).step_definition(job.step.step_name)
        try:
            backoff = resolve_wait(stored_backoff(job.arguments, definition), job.attempts)
        except Exception as failure:  # the backoff callable raised: no retry, the job fails with both errors
            error += f"\nThe backoff of {job.step.step_name} raised, so the job is not retried:\n{_formatted(failure)}"
            return JobStatus.FAILED if finish_attempt(job, JobStatus.FAILED, error=error) else ""
        # Only a fan-out that still waits wants the retry: not one cancelled or skipped meanwhile.
        source, target = job_event("retry")
        retried = FanOutJob.objects.filter(
            pk=job.pk, status=source, attempts=job.attempts, step__status=StepStatus.WAITING
        ).update(status=target, error=error, scheduled_at=clock.now() + backoff, stall_at=None)
        if retried:
            return JobStatus.PENDING
    return JobStatus.FAILED if finish_attempt(job, JobStatus.FAILED, error=error) else ""


def cancel_pending_jobs(step: WorkflowStep) -> int:
    """Cancel the jobs of ``step`` that have not started (running ones finish, their result unused)."""
    source, target = job_event("cancel")
    return FanOutJob.objects.filter(step_id=step.pk, status=source).update(status=target, finished_at=clock.now())


def results(run: WorkflowRun, step_name: str) -> Iterator[Any]:
    """The job results of the run's latest fan-out of ``step_name``, in job order."""
    step = (
        WorkflowStep.objects.filter(run_id=run.pk, step_name=step_name, fan_out_total__isnull=False)
        .order_by("-pk")
        .first()
    )
    if step is None:
        return iter(())
    return FanOutJob.objects.filter(step_id=step.pk).order_by("index").values_list("result", flat=True).iterator()
