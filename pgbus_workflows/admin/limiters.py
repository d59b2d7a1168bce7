"""The limiters list: each key in natural order (``account:2`` before ``account:10``), with its room now.

A rate limit's row stores its tokens when last counted; the list counts them again at the
time it is read (``limit`` per ``per`` since ``refilled_at``, up to ``limit``), so it shows
what the next claim would find, never the stale float.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Collate
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..dsl.limits import CONCURRENCY, RATE
from ..models import WorkflowLimiter
from ..sql import clock
from .display import format_duration
from .records import ReadOnlyAdmin

#: PostgreSQL's collation of the natural order (ICU, numbers by value), made by migration 0019.
NATURAL_COLLATION = "pgbus_workflows_natural"


class NaturalName(Collate):
    """A limiter's name in natural order: ``COLLATE pgbus_workflows_natural`` on PostgreSQL, the name elsewhere."""

    def __init__(self) -> None:
        super().__init__(F("name"), NATURAL_COLLATION)

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        """The plain name: SQLite knows no such collation (PostgreSQL's index serves the order there)."""
        return compiler.compile(self.get_source_expressions()[0])


def room_now(limiter: WorkflowLimiter, now: datetime) -> str:
    """``2 of 3 in use`` (a concurrency key) or ``1 of 5 tokens, next in 12 s`` (a rate limit), at ``now``."""
    if limiter.per is None:
        return f"{limiter.in_use} of {limiter.limit} in use"
    period = limiter.per.total_seconds()
    elapsed = max((now - limiter.refilled_at).total_seconds(), 0.0) if limiter.refilled_at else 0.0
    tokens = min(float(limiter.limit), (limiter.tokens or 0.0) + elapsed * limiter.limit / period)
    whole = math.floor(tokens)
    if whole >= limiter.limit:
        return f"{whole} of {limiter.limit} tokens"
    next_in = timedelta(seconds=(whole + 1 - tokens) * period / limiter.limit)
    return f"{whole} of {limiter.limit} tokens, next in {format_duration(next_in)}"


class KindFilter(admin.SimpleListFilter):
    """Concurrency keys or rate limits: the two kinds, named without listing the table's values."""

    title = _("kind")
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The two kinds of limiter."""
        return [(CONCURRENCY, CONCURRENCY), (RATE, RATE)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The limiters of the chosen kind, by the start of their name (the primary key's index)."""
        value = self.value()
        return queryset.filter(name__startswith=f"{value}:") if value in (CONCURRENCY, RATE) else queryset


@admin.register(WorkflowLimiter)
class WorkflowLimiterAdmin(ReadOnlyAdmin):
    """Each ``Concurrency`` key's slots in use and each ``RateLimit`` key's tokens, counted when the list is read.

    Named ``concurrency:<key>`` and ``rate:<key>``, listed in natural order; searched by the
    start of the name.
    """

    list_display = ("limiter_name", "kind", "limit", "per", "room", "repaired_at")
    list_filter = (KindFilter,)
    ordering = (NaturalName().asc(),)
    sortable_by = ("limiter_name",)
    search_fields = ("name",)
    search_help_text = _("The start of a limiter's name: concurrency:account, rate:stripe...")

    def search_condition(self, term: str) -> Q:
        """The limiters whose name begins with ``term`` (the primary key's index)."""
        return Q(name__startswith=term)

    @admin.display(description=_("name"), ordering=NaturalName())
    def limiter_name(self, limiter: WorkflowLimiter) -> str:
        """The limiter's name, ``<kind>:<key>``."""
        return limiter.name

    @admin.display(description=_("room now"))
    def room(self, limiter: WorkflowLimiter) -> str:
        """Slots in use, or whole tokens and when the next one comes, counted as the list is read."""
        return room_now(limiter, clock.now())
