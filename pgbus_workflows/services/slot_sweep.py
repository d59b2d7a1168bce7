"""The sweep's part in concurrency slots: a stalled cancelled attempt's given back, every limiter's count repaired.

A cancelled attempt whose body may still run keeps its slots (``services.slots``); the sweep
gives them back once it is stalled: past its ``stall_at``, or its dispatcher gone
(:func:`give_back_stalled`). And it sets each concurrency limiter's ``in_use`` to the
attempts really holding a slot (:func:`reconcile`): rows deleted outside the library leak the
slots they held, and nothing else would give them back.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import partial

from django.db import transaction
from django.db.models import Q

from ..conf import settings
from ..dsl.limits import CONCURRENCY, limit_label
from ..models import Dispatcher, WorkflowLimiter, WorkflowStep
from ..states import StepStatus
from .isolation import RowFailures
from .locks import locked_step
from .slots import concurrency_names, give_back

logger = logging.getLogger("pgbus_workflows")

#: Cancelled attempts one sweep gives back at most (more go at the next sweep).
BATCH_SIZE = 500


def live_dispatchers(now: datetime) -> set[str]:
    """The names of the dispatchers whose heartbeat is recent (the sweep forgets the others)."""
    recent = Dispatcher.objects.filter(heartbeat_at__gte=now - settings.DISPATCHER_DEAD_AFTER)
    return set(recent.values_list("name", flat=True))


def give_back_stalled(now: datetime, failures: RowFailures | None = None) -> int:
    """Give back the slots of cancelled attempts whose body is stalled: past ``stall_at``, or its dispatcher gone.

    Re-checked under the run's lock; a run another transaction holds is passed over.
    """
    failures = failures or RowFailures()
    alive = live_dispatchers(now)
    gone = ~Q(claimed_by="") & ~Q(claimed_by__in=sorted(alive))
    stalled = WorkflowStep.objects.filter(Q(stall_at__isnull=True) | Q(stall_at__lt=now) | gone, holds_slots=True)
    found = stalled.exclude(pk__in=failures.passed_over("cancelled_slots")).order_by("pk")
    return sum(
        failures.act("cancelled_slots", pk, run_pk, partial(_give_back_stalled, pk, run_pk, now, alive))
        for pk, run_pk in found.values_list("pk", "run_id")[:BATCH_SIZE]
    )


def _stalled(stall_at: datetime | None, claimed_by: str, now: datetime, alive: set[str]) -> bool:
    return stall_at is None or stall_at < now or (bool(claimed_by) and claimed_by not in alive)


def _give_back_stalled(step_pk: int, run_pk: int, now: datetime, alive: set[str]) -> bool:
    with locked_step(run_pk, step_pk, now=now, skip_locked=True) as (ledger, step):
        if step is None or not _stalled(step.stall_at, step.claimed_by, now, alive):
            return False
        given = give_back(ledger, step)
    if given:
        logger.warning(
            "Cancelled step %s #%s of run %s (claimed by %s) stalled: its slots %s are given back",
            step.step_name,
            step.attempt,
            run_pk,
            step.claimed_by or "?",
            ", ".join(concurrency_names(step)),
        )
    return given


def holders() -> Q:
    """The attempts that hold their concurrency slots: in progress, or cancelled with their body still running."""
    return Q(status=StepStatus.IN_PROGRESS, limiters__isnull=False) | Q(holds_slots=True)


def reconcile(now: datetime) -> int:
    """Set each concurrency limiter's ``in_use`` to the attempts holding its slots; returns how many were wrong.

    A first read, without locks, finds the limiters whose count looks wrong (those with slots
    in use, and those of the attempts holding one). Each is then repaired on its own: its row
    locked (``SKIP LOCKED``: one a claim or an outcome holds now is left for the next sweep),
    then, in a later statement (so with a snapshot taken after the lock), the attempts
    holding it counted; attempts in progress are few, bounded by the dispatchers' workers.

    A claim or an outcome changes the attempts and ``in_use`` in one transaction that holds
    the row's lock until it commits: once the lock is ours, each such transaction has
    committed or rolled back, and one that has not taken the lock yet has changed neither.
    A move that keeps the count (a chained step taking over its run's slot, a cancel of a
    running attempt) commits its rows at once, so a count sees it whole or not at all.
    """
    held = _held_counts(WorkflowStep.objects.filter(holders()).values_list("limiters", flat=True))
    suspects = WorkflowLimiter.objects.filter(kind=CONCURRENCY).filter(Q(in_use__gt=0) | Q(name__in=list(held)))
    wrong = [name for name, in_use in suspects.values_list("name", "in_use") if in_use != held.get(name, 0)]
    return sum(_repair(name, now) for name in sorted(wrong))


def _held_counts(limiter_lists: Iterable[Sequence[str] | None]) -> Counter[str]:
    return Counter(name for names in limiter_lists for name in names or () if limit_label(name)[0] == CONCURRENCY)


def _repair(name: str, now: datetime) -> bool:
    """Set one limiter's ``in_use`` to its holders' count, its row locked first (see :func:`reconcile`)."""
    with transaction.atomic():
        limiter = WorkflowLimiter.objects.select_for_update(skip_locked=True).filter(name=name).first()
        if limiter is None:
            return False
        count = _held_counts(WorkflowStep.objects.filter(holders()).values_list("limiters", flat=True))[name]
        if limiter.in_use == count:
            return False
        WorkflowLimiter.objects.filter(name=name).update(in_use=count, repaired_at=now)
    logger.warning(
        "Limiter %s counted %d slot(s) in use, but %d attempt(s) hold one: repaired", name, limiter.in_use, count
    )
    return True
