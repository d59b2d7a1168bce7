"""The limiters as an operator reads them: each key's room now and the steps it holds back.

A read model for the admin's list of limiters, the run page and the MCP ``limits`` tool; it
writes nothing. A rate limit's row stores its tokens when last counted: its room is counted
again at the time asked (``limit`` per ``per`` since ``refilled_at``, up to ``limit``), so it
says what the next claim would find, never the stale float.

A step is held back by a limiter when it is scheduled and either parked on it (a claim found
the key with no room: ``parked_on``, the parked index) or due, not yet parked, in a ready run,
and under it while it has no room (the steps a claim has not reached yet). These are the steps
``limiting.held_back_counts`` counts for the gauge, the dashboard and ``health``, by key.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, F, Q, QuerySet

from ..dsl.declared import registry
from ..dsl.limits import CONCURRENCY, RATE, Concurrency, declared_limits, limit_label
from ..models import WorkflowLimiter, WorkflowStep
from ..states import StepStatus
from .limiting import room

#: What the MCP ``limits`` tool sorts the keys by: the steps they hold back, or their use now.
ORDERS = ("held_back", "in_use")


@dataclass(frozen=True)
class LimiterState:
    """One limiter at the time it was read: its room, and how many steps it holds back."""

    #: ``concurrency:<key>`` or ``rate:<key>``.
    name: str
    kind: str
    key: str
    limit: int
    #: A rate limit's period (None for a concurrency key).
    per: timedelta | None
    #: A concurrency key's slots in use (None for a rate limit).
    in_use: int | None
    #: A rate limit's whole tokens now (None for a concurrency key).
    tokens: int | None
    #: A rate limit's wait for its next whole token (None: its bucket is full, or a concurrency key).
    next_token_in: timedelta | None
    #: The scheduled steps it holds back (parked on it, or due under it while it has no room).
    held_back: int

    @property
    def used(self) -> int:
        """Slots in use, or the tokens spent of the bucket: what ``in_use`` sorts by."""
        return self.in_use if self.in_use is not None else self.limit - (self.tokens or 0)

    def as_dict(self) -> dict[str, Any]:
        """The state as JSON-ready values, the period and the wait in seconds."""
        row: dict[str, Any] = {"kind": self.kind, "key": self.key, "limit": self.limit}
        if self.per is None:
            row["in_use"] = self.in_use
        else:
            row["per_seconds"] = self.per.total_seconds()
            row["tokens"] = self.tokens
            row["next_token_in_seconds"] = None if self.next_token_in is None else self.next_token_in.total_seconds()
        row["held_back"] = self.held_back
        return row


def state(limiter: WorkflowLimiter, now: datetime, held_back: int = 0) -> LimiterState:
    """``limiter`` as it is at ``now``: slots in use, or whole tokens and the wait for the next one."""
    kind, key = limit_label(limiter.name)
    if limiter.per is None:
        return LimiterState(limiter.name, kind, key, limiter.limit, None, limiter.in_use, None, None, held_back)
    period = limiter.per.total_seconds()
    elapsed = max((now - limiter.refilled_at).total_seconds(), 0.0) if limiter.refilled_at else 0.0
    tokens = min(float(limiter.limit), (limiter.tokens or 0.0) + elapsed * limiter.limit / period)
    whole = min(math.floor(tokens), limiter.limit)
    wait = None if whole >= limiter.limit else timedelta(seconds=(whole + 1 - tokens) * period / limiter.limit)
    return LimiterState(limiter.name, kind, key, limiter.limit, limiter.per, None, whole, wait, held_back)


def _waiting(now: datetime) -> QuerySet[WorkflowStep]:
    """Due attempts under limits, not parked yet, of ready runs (the partial index ``pgbus_wf_step_limited``)."""
    return WorkflowStep.objects.filter(
        status=StepStatus.SCHEDULED,
        held=False,
        parked=False,
        scheduled_at__lte=now,
        limiters__isnull=False,
        run__status="ready",
    )


def _parked() -> QuerySet[WorkflowStep]:
    """The attempts parked by a limit (the parked index; an operator's holds park on ``hold:...``, left out)."""
    return WorkflowStep.objects.filter(status=StepStatus.SCHEDULED, parked=True, parked_on__gt="").exclude(
        parked_on__startswith="hold:"
    )


def held_back_by(limiters: Iterable[WorkflowLimiter], now: datetime) -> dict[str, int]:
    """``{name: steps}`` each of ``limiters`` holds back at ``now`` (names holding none left out).

    One grouped count of the parked index for the names, and, when one of them has no room,
    one read of the due attempts under limits not yet parked (what the gauge reads).
    """
    rows = list(limiters)
    names = [limiter.name for limiter in rows]
    if not names:
        return {}
    parked = _parked().filter(parked_on__in=names).order_by().values_list("parked_on").annotate(n=Count("pk"))
    counts: Counter[str] = Counter(dict(parked))
    full = {limiter.name for limiter in rows if room(limiter, now) < 1}
    if full:
        for under in _waiting(now).values_list("limiters", flat=True):
            counts.update(full.intersection(under or ()))
    return dict(counts)


def held_back_steps(name: str, now: datetime) -> Q:
    """The attempts limiter ``name`` holds back at ``now`` (a condition): parked on it, or due under it, full.

    The parked ones through the parked index; the others (only while the key has no room)
    through the partial index of due attempts under limits: the two read apart and joined
    (``UNION``), so neither is a filter on a walk of every attempt.
    """
    parked = Q(status=StepStatus.SCHEDULED, parked=True, parked_on=name)
    limiter = WorkflowLimiter.objects.filter(name=name).first()
    if limiter is None or room(limiter, now) >= 1 or not _contains_json(WorkflowStep.objects.db):
        return parked
    waiting = _waiting(now).filter(limiters__contains=[name]).order_by().values("pk")
    return Q(pk__in=WorkflowStep.objects.filter(parked).order_by().values("pk").union(waiting))


def _contains_json(alias: str) -> bool:
    """Whether the database ``alias`` finds a value in a JSON list (PostgreSQL's ``@>``; not SQLite)."""
    return bool(connections[alias].features.supports_json_field_contains)


def busiest(now: datetime, kind: str | None = None, order: str = "held_back") -> list[LimiterState]:
    """Every limiter in use or holding steps back at ``now``, of ``kind`` if given, busiest first.

    ``order`` ``held_back``: most steps held back first, then most in use; ``in_use``: most
    slots in use (tokens spent) first, then most held back; ties in natural order of name.
    Idle keys (no slot in use, a full bucket, nothing held back) are left out. Reads the
    limiters in use (the table of keys, one small row each), the parked index grouped by key
    and the due attempts under limits not yet parked.
    """
    in_use = WorkflowLimiter.objects.filter(Q(in_use__gt=0) | Q(per__isnull=False, tokens__lt=F("limit")))
    rows = {limiter.name: limiter for limiter in in_use}
    parked = dict(_parked().order_by().values_list("parked_on").annotate(n=Count("pk")))
    missing = [name for name in parked if name not in rows]
    rows.update({limiter.name: limiter for limiter in WorkflowLimiter.objects.filter(name__in=missing)})
    counts: Counter[str] = Counter(parked)
    full = {name for name, limiter in rows.items() if room(limiter, now) < 1}
    if full:
        for under in _waiting(now).values_list("limiters", flat=True):
            counts.update(full.intersection(under or ()))
    states = [state(limiter, now, counts.get(name, 0)) for name, limiter in rows.items()]
    states = [s for s in states if (kind is None or s.kind == kind) and (s.used > 0 or s.held_back > 0)]
    first, second = ("held_back", "used") if order == "held_back" else ("used", "held_back")
    return sorted(states, key=lambda s: (-getattr(s, first), -getattr(s, second), natural_key(s.name)))


def natural_key(name: str) -> tuple[Any, ...]:
    """``name`` as natural order compares it: ``account:2`` before ``account:10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def fixed_names() -> set[str]:
    """The limiter names the registered code fixes (a string key, not a callable of a run's arguments)."""
    names = set()
    for cls in registry.classes():
        for definition in cls.step_definitions():
            for limit in declared_limits(cls, definition):
                if isinstance(limit.key, str):
                    names.add(f"{CONCURRENCY if isinstance(limit, Concurrency) else RATE}:{limit.key}")
    return names
