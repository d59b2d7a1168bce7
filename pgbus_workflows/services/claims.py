"""Claiming due steps: the claim transaction, and the re-check of claims before their bodies run.

``claim_due_steps`` claims up to ``limit`` due attempts in one short transaction: runs locked
with ``SKIP LOCKED`` (two dispatchers never claim one step), then every claimed step and its
run moved and recorded together, as one batch of units of work. ``claim_and_look_ahead`` (the
dispatcher's loop) also reads, in the same round trip, when it must look again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Min

from .. import clock, rows, sql
from ..bulk import WriteBatch
from ..conf import settings
from ..deploy import can_run_step
from ..models import FanOutJob, WorkflowRun, WorkflowStep
from ..states import JobStatus, RunStatus, StepStatus
from .ledger import RunLedger
from .locks import locked_step, locked_steps
from .outcome import stall_step


@dataclass(frozen=True)
class LookAhead:
    """What a claim saw beyond the steps it took: when the loop must look again, and whether jobs are due."""

    #: The earliest ``scheduled_at`` after the claim's ``now`` of a step of a ready run or of
    #: a pending job (None: nothing is scheduled later), so a wait or backoff ending between
    #: polls is met.
    next_due_at: datetime | None
    #: Whether a pending job is due now (when not, the loop makes no job claim).
    jobs_due: bool


def claim_due_steps(limit: int, queues: Iterable[str] | None = None, claimed_by: str = "") -> list[WorkflowStep]:
    """Claim up to ``limit`` due steps of ready runs, by priority then ``scheduled_at``.

    Each claimed attempt is ``in_progress`` with its ``stall_at`` set and its run
    ``performing``; the list is what the caller must now pass to :func:`execute_step`.
    Only steps this process's code can run are claimed (``deploy.can_run_step``): a step of
    a class or a step name that only newer code knows is passed over, for a dispatcher that
    knows it (or, after ``UNKNOWN_STEP_GRACE``, for the sweep to pause its run).
    """
    return _claim_due(limit, queues, claimed_by, look=False)[0]


def claim_and_look_ahead(
    limit: int, queues: Iterable[str] | None = None, claimed_by: str = ""
) -> tuple[list[WorkflowStep], LookAhead]:
    """:func:`claim_due_steps`, and what the dispatcher's loop needs to know to sleep (no extra round trip)."""
    return _claim_due(max(limit, 1), queues, claimed_by, look=True)


def _claim_due(
    limit: int, queues: Iterable[str] | None, claimed_by: str, look: bool
) -> tuple[list[WorkflowStep], LookAhead]:
    if limit < 1:
        return [], LookAhead(None, jobs_due=False)
    now = clock.now()
    queue_list = None if queues is None else list(queues)
    own_transaction = not transaction.get_connection().in_atomic_block
    with transaction.atomic():
        for _ in range(_MAX_PASSES):
            # Names seen before and still unknown are left out in SQL: the normal case (every
            # dispatcher on the same code) sends the same statement as before, no filter.
            unknown = sorted(key for key in tuple(_unrunnable) if not can_run_step(*key))  # tuple(): copied at once
            due, ahead = _due(limit, queue_list, now, unknown, own_transaction, look)
            new = {(run.workflow_class, step.step_name) for run, step in due if not can_run_step(*_names(run, step))}
            if not new:
                break
            _unrunnable.update(new)
        runnable = [(run, step) for run, step in due if can_run_step(*_names(run, step))]
        if not sql.postgresql():
            return _claim([(step.pk, run.pk) for run, step in runnable], now, claimed_by), ahead
        return _claim_locked(runnable, now, claimed_by, commit=own_transaction), ahead


def _names(run: WorkflowRun, step: WorkflowStep) -> tuple[str, str]:
    return run.workflow_class, step.step_name


#: ``(class, step name)`` pairs this process was offered and cannot run (left out of later claims).
_unrunnable: set[tuple[str, str]] = set()
#: Claim queries one claim makes at most while it learns names it cannot run.
_MAX_PASSES = 5


def _due(
    limit: int, queues: list[str] | None, now: Any, unknown: list[tuple[str, str]], own_transaction: bool, look: bool
) -> tuple[list[tuple[WorkflowRun, WorkflowStep]], LookAhead]:
    """Due steps of ready runs with their runs, locked (PostgreSQL: both rows, one round trip).

    With SKIP LOCKED: a run another dispatcher (or an operator) holds is passed over, not
    waited for. The order is the partial index ``pgbus_wf_step_due``'s; ``unknown`` pairs
    are left out. On SQLite (one writer at a time) the rows are only read: :func:`_claim`
    locks them again as every unit of work does. ``own_transaction``: the claim is a
    transaction of its own (not the caller's), whose commit need not wait for the disk.
    ``look``: also read the :class:`LookAhead` (PostgreSQL: in the same round trip).
    """
    if not sql.postgresql():
        due = WorkflowStep.objects.select_related("run").filter(
            status=StepStatus.SCHEDULED, scheduled_at__lte=now, run__status=RunStatus.READY
        )
        if queues is not None:
            due = due.filter(queue__in=queues)
        for klass, name in unknown:
            due = due.exclude(run__workflow_class=klass, step_name=name)
        found = [(step.run, step) for step in due.order_by("priority", "scheduled_at", "pk")[:limit]]
        return found, _look_ahead_orm(queues, now) if look else LookAhead(None, jobs_due=False)
    params: list[Any] = [now, *([] if queues is None else [queues])]
    for pair in unknown:
        params.extend(pair)
    params.append(limit)
    # In a pipeline: the transaction's BEGIN goes in the same round trip. The claim's commit
    # need not wait for the disk (see ``commit_without_flush``): the outcome's commit does.
    ahead = LookAhead(None, jobs_due=False)
    # One statement per cursor: in a pipeline, a cursor that ran two may hand back the first one's rows.
    with sql.pipeline() as flag:
        if own_transaction:
            flag.execute(sql.statement("commit_without_flush"))
        with closing(sql.pipelined_cursor()) as cursor, closing(sql.pipelined_cursor()) as second:
            cursor.execute(sql.statement("due_steps", queues is not None, len(unknown)), params)
            if look:
                per_table = [now, *([] if queues is None else [queues])]
                second.execute(sql.statement("look_ahead", queues is not None), per_table * 3)
            found = cursor.fetchall()
            if look:
                next_due_at, jobs_due = second.fetchone()
                ahead = LookAhead(next_due_at, jobs_due=bool(jobs_due))
    split = len(WorkflowRun._meta.concrete_fields)
    claimed = [(rows.from_row(WorkflowRun, row[:split]), rows.from_row(WorkflowStep, row[split:])) for row in found]
    return claimed, ahead


def _look_ahead_orm(queues: list[str] | None, now: Any) -> LookAhead:
    """The :class:`LookAhead` through the ORM (SQLite)."""
    steps = WorkflowStep.objects.filter(status=StepStatus.SCHEDULED, run__status=RunStatus.READY)
    jobs = FanOutJob.objects.filter(status=JobStatus.PENDING)
    if queues is not None:
        steps, jobs = steps.filter(queue__in=queues), jobs.filter(queue__in=queues)
    later = [qs.filter(scheduled_at__gt=now).aggregate(at=Min("scheduled_at"))["at"] for qs in (steps, jobs)]
    next_due_at = min((at for at in later if at is not None), default=None)
    return LookAhead(next_due_at, jobs_due=jobs.filter(scheduled_at__lte=now).exists())


def claim_step(step_pk: int, claimed_by: str = "") -> WorkflowStep | None:
    """Claim one scheduled step whatever its ``scheduled_at`` (test helpers, ``run_now``).

    Returns None (a no-op) when the step is no longer scheduled or its run is not ready.
    """
    run_id = WorkflowStep.objects.filter(pk=step_pk).values_list("run_id", flat=True).first()
    if run_id is None:
        return None
    with transaction.atomic():
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id, status=RunStatus.READY).first()
        if run is None:
            return None
        claimed = _claim([(step_pk, run_id)], clock.now(), claimed_by)
        return claimed[0] if claimed else None


def _claim(pairs: list[tuple[int, int]], now: Any, claimed_by: str) -> list[WorkflowStep]:
    """Move the locked runs' scheduled steps to in_progress, the runs to performing (one batch)."""
    if not pairs:
        return []
    claimed = []
    items = [(run_pk, step_pk, None) for step_pk, run_pk in pairs]
    with locked_steps(items, now=now, savepoint=False) as units:
        for ledger, step in units:
            if ledger is None or step is None or step.status != StepStatus.SCHEDULED:
                continue
            if ledger.run.status != RunStatus.READY:
                continue
            _claim_in_ledger(ledger, step, claimed_by)
            claimed.append(step)
    return claimed


def _claim_locked(
    due: list[tuple[WorkflowRun, WorkflowStep]], now: Any, claimed_by: str, *, commit: bool
) -> list[WorkflowStep]:
    """Claim attempts whose rows this transaction has locked: every write in one round trip.

    ``commit``: the claim is a transaction of its own, and its COMMIT goes in that round trip too.
    """
    writes = WriteBatch()
    for run, step in due:
        ledger = RunLedger(run, now, writes=writes)
        _claim_in_ledger(ledger, step, claimed_by)
        ledger.flush()
    if due:
        writes.send(settings.NOTIFY_CHANNEL, commit=commit)
    return [step for _, step in due]


def _claim_in_ledger(ledger: RunLedger, step: WorkflowStep, claimed_by: str) -> None:
    """Claim a scheduled attempt of the locked run: the step in progress, the run performing."""
    ledger.move_step(
        step,
        "claim",
        started_at=ledger.now,
        claimed_by=claimed_by,
        stall_at=ledger.now + (step.timeout or settings.STALL_THRESHOLD),
    )
    details: dict[str, Any] = {"attempt": step.attempt}
    if claimed_by:
        details["claimed_by"] = claimed_by
    ledger.transition("claim", RunStatus.PERFORMING, kind="step_started", step=step, details=details)
    step.run = ledger.run


def still_in_progress(step_pks: Sequence[int]) -> set[int]:
    """Which of these claimed attempts are still in progress (not cancelled or stalled since)."""
    if not step_pks:
        return set()
    if not sql.postgresql():
        running = WorkflowStep.objects.filter(pk__in=step_pks, status=StepStatus.IN_PROGRESS)
        return set(running.values_list("pk", flat=True))
    with sql.cursor() as cursor:
        cursor.execute(sql.statement("steps_in_progress"), [list(step_pks)])
        return {row[0] for row in cursor.fetchall()}


def heartbeat(step: WorkflowStep) -> bool:
    """Push a running attempt's ``stall_at`` to now + its timeout (or ``STALL_THRESHOLD``).

    Under the run lock, like the sweep that would stall it; False (and nothing written)
    when the attempt is no longer in progress.
    """
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is None or locked.status != StepStatus.IN_PROGRESS:
            return False
        locked.stall_at = ledger.now + (locked.timeout or settings.STALL_THRESHOLD)
        rows.update(locked, ["stall_at"])
    step.stall_at = locked.stall_at
    return True


def stall(step_pk: int, run_pk: int, *, detection: str, now: datetime | None = None, skip_locked: bool = False) -> bool:
    """Stall one in-progress attempt, re-checked under the run lock; False when it moved on.

    ``skip_locked`` (the sweep) raises :class:`~.locks.RunLocked` rather than wait for a
    run another transaction holds: a held run is alive (an ``atomic=True`` body runs).
    """
    with locked_step(run_pk, step_pk, now=now, skip_locked=skip_locked) as (ledger, step):
        if step is None or step.status != StepStatus.IN_PROGRESS:
            return False
        if detection == "stall_at" and (step.stall_at is None or step.stall_at >= ledger.now):
            return False
        stall_step(ledger, step, detection=detection)
        return True
