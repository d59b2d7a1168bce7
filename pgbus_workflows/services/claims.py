"""Claiming due steps: the claim, and the re-check of claims before their bodies run.

``claim_due_steps`` claims up to ``limit`` due attempts. On PostgreSQL that is one statement
(``sql`` ``claim_steps``), a transaction of its own unless the caller's is open: runs locked
with ``SKIP LOCKED`` (two dispatchers never claim one step), every claimed attempt and its
run moved and recorded as the run's ledger would (``claim_step`` goes through the ledger; a
test holds the two to the same rows), and when the loop must look again, all in one round
trip. ``claim_and_look_ahead`` (the dispatcher's loop) returns that look-ahead too. On
SQLite the claim goes through the ORM and the ledger.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from django.db import transaction
from django.db.models import Min
from psycopg.types.json import Jsonb

from .. import signals, sql
from ..conf import settings
from ..dsl.deploy import any_fairness, can_run_step, catalog_json
from ..models import FanOutJob, HoldKind, WorkflowEvent, WorkflowHold, WorkflowRun, WorkflowStep
from ..sql import clock, rows
from ..sql.claiming import ClaimRow, claim_parameters
from ..states import JobStatus, RunStatus, StepStatus
from . import limiting
from .ledger import SYSTEM_ACTOR, RunLedger
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
    limit: int, queues: Iterable[str] | None = None, claimed_by: str = "", *, due_for: timedelta = timedelta(0)
) -> tuple[list[WorkflowStep], LookAhead]:
    """:func:`claim_due_steps`, and what the dispatcher's loop needs to know to sleep (no extra round trip).

    ``due_for``: claim only steps due for at least that long (a dispatcher that follows the
    first of its group leaves it what it takes at once; see ``dispatcher.wakeups``).
    """
    return _claim_due(max(limit, 1), queues, claimed_by, look=True, due_for=due_for)


def _claim_due(
    limit: int, queues: Iterable[str] | None, claimed_by: str, look: bool, due_for: timedelta = timedelta(0)
) -> tuple[list[WorkflowStep], LookAhead]:
    if limit < 1:
        return [], LookAhead(None, jobs_due=False)
    now = clock.now()
    queue_list = None if queues is None else list(queues)
    if not sql.postgresql():
        return _claim_orm(limit, queue_list, now, claimed_by, look, now - due_for)
    # A claim of its own runs in autocommit: one statement, its own transaction, one round trip.
    own_transaction = not transaction.get_connection().in_atomic_block
    claimed: list[WorkflowStep] = []
    for _ in range(_MAX_PASSES):
        # Names seen before and still unknown are left out in SQL: the normal case (every
        # dispatcher on the same code) sends the same statement as before, no filter.
        unknown = sorted(key for key in tuple(_unrunnable) if not can_run_step(*key))  # tuple(): copied at once
        more, passed_over, ahead, past_room, moved = _claim_pass(
            limit - len(claimed), queue_list, now, now - due_for, unknown, claimed_by, own_transaction
        )
        claimed += more
        _unrunnable.update(passed_over)
        if moved.parked >= moved.looked_at:  # more may wait at the front: parked in batches, once
            _park_held_back(now)
        # Steps of a key past its room took places in the claim: the next pass, the key now
        # full, walks past its steps to other keys' (a held-back key never delays another's).
        # Steps put back are taken by the next pass (its statement sees them).
        if not (passed_over or past_room or moved.put_back or moved.parked) or len(claimed) >= limit:
            break
    _announce_claims(claimed)
    return claimed, ahead


@dataclass(frozen=True)
class Parking:
    """What one claim statement did to held-back steps (``sql.limiting.park`` and ``unpark``)."""

    #: Steps held back by a limiter with no room, taken out of the claims' range.
    parked: int
    #: Parked steps of keys with room again, put back for the next claim.
    put_back: int
    #: How many of the first due steps under limits the claim looked at for parking.
    looked_at: int


#: Due steps under limits a parking statement reads at most (a full key's backlog is parked in such batches).
PARK_BATCH = 5000
#: Parking statements one claim runs at most (the rest is parked by the claims that follow).
_MAX_PARK_BATCHES = 20


def _park_held_back(now: datetime) -> None:
    """Park the held-back steps at the front of the due steps under limits, a batch at a time, until fewer wait."""
    for _ in range(_MAX_PARK_BATCHES):
        with sql.bound_cursor() as cursor:
            cursor.execute(sql.statement("park_held_back"), [now, PARK_BATCH])
            if cursor.fetchone()[0] < PARK_BATCH:
                return


def _claim_orm(
    limit: int, queues: list[str] | None, now: Any, claimed_by: str, look: bool, due_by: Any
) -> tuple[list[WorkflowStep], LookAhead]:
    """The claim through the ORM (SQLite: one writer at a time, the rows locked again as every unit of work does)."""
    with transaction.atomic():
        for _ in range(_MAX_PASSES):
            unknown = sorted(key for key in tuple(_unrunnable) if not can_run_step(*key))
            due = WorkflowStep.objects.select_related("run").filter(
                status=StepStatus.SCHEDULED, held=False, scheduled_at__lte=due_by, run__status=RunStatus.READY
            )
            if queues is not None:
                due = due.filter(queue__in=queues)
            held = WorkflowHold.objects.active()  # an operator's holds (services.holding)
            due = due.exclude(run__workflow_class__in=held.filter(kind=HoldKind.CLASS).values("name"))
            due = due.exclude(queue__in=held.filter(kind=HoldKind.QUEUE).values("name"))
            for klass, name in unknown:
                due = due.exclude(run__workflow_class=klass, step_name=name)
            full = limiting.full(now)  # a step of a key with no room is passed over, not counted
            ordered = due.order_by("priority", "scheduled_at", "pk").iterator(chunk_size=limit)
            found = list(islice((s for s in ordered if not full.intersection(s.limiters or ())), limit))
            new = {_names(step) for step in found if not can_run_step(*_names(step))}
            if not new:
                break
            _unrunnable.update(new)
        pairs = [(step.pk, step.run_id) for step in found if can_run_step(*_names(step))]
        ahead = _look_ahead_orm(queues, now) if look else LookAhead(None, jobs_due=False)
        return _claim(pairs, now, claimed_by), ahead


def _names(step: WorkflowStep) -> tuple[str, str]:
    return step.run.workflow_class, step.step_name


#: ``(class, step name)`` pairs this process was offered and cannot run (left out of later claims).
_unrunnable: set[tuple[str, str]] = set()
#: Claim queries one claim makes at most while it learns names it cannot run.
_MAX_PASSES = 5


def _claim_pass(
    limit: int,
    queues: list[str] | None,
    now: Any,
    due_by: Any,
    unknown: list[tuple[str, str]],
    claimed_by: str,
    own_transaction: bool,
) -> tuple[list[WorkflowStep], set[tuple[str, str]], LookAhead, bool, Parking]:
    """One claim statement (``sql`` ``claim_steps``): the steps claimed, the pairs passed over, the look-ahead.

    And whether steps were left because their key had no more room in this claim, and the
    steps it parked and put back (:class:`Parking`).

    ``own_transaction``: the statement is its own transaction (autocommit), whose commit
    need not wait for the disk (the outcome's commit does). Steps due by ``due_by`` are
    claimed; ``unknown`` pairs are left out of them, and a due step of a pair this process's
    code cannot run is passed over.
    """
    event = _started_event(now, claimed_by)
    db = transaction.get_connection()
    params = claim_parameters(
        now=now,
        due_by=due_by,
        queues=queues,
        limit=limit,
        catalog=_catalog_parameter(),
        claimed_by=claimed_by,
        stall_threshold=settings.STALL_THRESHOLD,
        unknown=unknown,
        event={a: rows.prepared(event, a, p, db) for a, p in rows.insert_columns(WorkflowEvent, leave_out=_FILLED_IN)},
    )
    text = sql.statement("claim_steps", queues is not None, len(unknown), own_transaction, any_fairness())
    if own_transaction:
        found = sql.fetch_in_index_order(text, params)
    else:  # the setting would last until the caller's commit
        with sql.bound_cursor() as cursor:
            cursor.execute(text, params)
            found = cursor.fetchall()
    named = [ClaimRow.read(row) for row in found]
    ahead = LookAhead(named[0].next_due_at, jobs_due=bool(named[0].jobs_due))
    moved = Parking(parked=named[0].parked, put_back=named[0].put_back, looked_at=limit)
    claimed, passed_over, past_room = [], set(), False
    for row in named:
        if row.class_name is None or row.step_name is None:
            continue  # nothing was due: the look-ahead's row alone
        if row.run is None or row.step is None:
            if can_run_step(row.class_name, row.step_name):
                past_room = True  # past its key's room in this claim: left for the next
            else:
                passed_over.add((row.class_name, row.step_name))
            continue
        step = rows.from_row(WorkflowStep, row.step)
        step.run = rows.from_row(WorkflowRun, row.run)
        claimed.append(step)
    claimed.sort(key=lambda step: (step.priority, step.fair_at or step.scheduled_at, step.pk))
    return claimed, passed_over, ahead, past_room, moved


#: The event columns the claim statement fills in from the attempt it claimed.
_FILLED_IN = ("run_id", "step_id")


def _started_event(now: datetime, claimed_by: str) -> WorkflowEvent:
    """The ``step_started`` event of a claim, as :func:`_claim_in_ledger` records it, but for its run and attempt.

    The claim statement sets the run and the step, and puts the attempt's number before these details.
    """
    return rows.build(
        WorkflowEvent,
        kind="step_started",
        transition="claim",
        from_status=RunStatus.READY,
        to_status=RunStatus.PERFORMING,
        actor=SYSTEM_ACTOR,
        reason="",
        details={"claimed_by": claimed_by} if claimed_by else {},
        created_at=now,
    )


def _catalog_parameter() -> Jsonb:
    """This process's catalog as the claim's jsonb parameter (its JSON text made once per registry)."""
    text = catalog_json()
    return Jsonb(None, dumps=lambda _: text)


def _announce_claims(claimed: list[WorkflowStep]) -> None:
    """``workflow_transitioned`` for each claimed run once the claim commits (only when someone listens).

    At once for a claim of its own (committed already); inside a caller's transaction, after it commits.
    """
    if not claimed or not signals.workflow_transitioned.has_listeners():
        return
    moved = [(step.run.workflow_class, step.run.workflow_id) for step in claimed]

    def send() -> None:
        for sender, workflow_id in moved:
            signals.workflow_transitioned.send(
                sender=sender,
                workflow_id=workflow_id,
                transition="claim",
                from_status=RunStatus.READY,
                to_status=RunStatus.PERFORMING,
                actor=SYSTEM_ACTOR,
            )

    transaction.on_commit(send)  # runs now outside a transaction


def _look_ahead_orm(queues: list[str] | None, now: Any) -> LookAhead:
    """The :class:`LookAhead` through the ORM (SQLite)."""
    steps = WorkflowStep.objects.filter(status=StepStatus.SCHEDULED, held=False, run__status=RunStatus.READY)
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
            if ledger.run.status != RunStatus.READY or not limiting.take(step, now):
                continue  # not ready, or held back by a limit with no room
            _claim_in_ledger(ledger, step, claimed_by)
            claimed.append(step)
    return claimed


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
    # Bound on the server (prepared in a dispatcher): a worker asks this before most claims
    # that waited in the shared queue, and a client-bound text was parsed and planned each time.
    # Planned on indexes: a plan the connection made while the table was small read it whole.
    if transaction.get_connection().in_atomic_block:
        with sql.bound_cursor(timestamps=False) as cursor:
            cursor.execute(sql.statement("steps_in_progress"), [list(step_pks)])
            return {row[0] for row in cursor.fetchall()}
    return {row[0] for row in sql.fetch_in_index_order(sql.statement("steps_in_progress"), [list(step_pks)])}


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
