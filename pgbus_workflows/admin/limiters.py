"""The limiters list: each key in natural order (``account:2`` before ``account:10``), with its room now.

A rate limit's row stores its tokens when last counted; the list counts them again at the
time it is read (``limit`` per ``per`` since ``refilled_at``, up to ``limit``), so it shows
what the next claim would find, never the stale float (``services.limiters``). Each row links
the scheduled steps the key holds back (the steps list filtered ``?held_back_by=<name>``),
with their count, read for the page's rows in one grouped count of the parked index.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Collate
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..dsl.limits import CONCURRENCY, RATE
from ..models import WorkflowLimiter
from ..services.limiters import LimiterState, held_back_by, natural_key, state
from ..sql import clock
from .display import changelist_url, format_duration
from .filters import HeldBackByFilter
from .records import ReadOnlyAdmin

#: The attribute a listed limiter carries its held-back steps' count in (set for the page's rows at once).
HELD_BACK_COUNT = "pgbus_held_back"
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
    return room_text(state(limiter, now))


def room_text(found: LimiterState) -> str:
    """A limiter's room as it was read: ``2 of 3 in use``, ``1 of 5 tokens, next in 12.0 s``, ``5 of 5 tokens``."""
    if found.in_use is not None:
        return f"{found.in_use} of {found.limit} in use"
    if found.next_token_in is None:
        return f"{found.tokens} of {found.limit} tokens"
    return f"{found.tokens} of {found.limit} tokens, next in {format_duration(found.next_token_in)}"


def held_back_link(site_name: str, name: str, count: int) -> SafeString:
    """``count`` steps, linked to the list of the attempts limiter ``name`` holds back (``?held_back_by=``)."""
    url = changelist_url(site_name, "workflowstep", **{HeldBackByFilter.parameter_name: name})
    return format_html('<a href="{}">{}</a>', url, ngettext("%(n)s step", "%(n)s steps", count) % {"n": count})


def run_limiters(site_name: str, names: list[str], now: datetime) -> list[dict[str, Any]]:
    """The run page's limiters: each of ``names`` with its room now and its held-back steps, linked, in natural order.

    Each links the limiters list filtered to it (``?name=``) and the steps it holds back. A
    name whose row is gone limits nothing and is left out.
    """
    limiters = sorted(WorkflowLimiter.objects.filter(name__in=names), key=lambda limiter: natural_key(limiter.name))
    counts = held_back_by(limiters, now)
    return [
        {
            "name": limiter.name,
            "url": changelist_url(site_name, "workflowlimiter", name=limiter.name),
            "room": room_now(limiter, now),
            "held_back": held_back_link(site_name, limiter.name, counts.get(limiter.name, 0)),
        }
        for limiter in limiters
    ]


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

    list_display = ("limiter_name", "kind", "limit", "per", "room", "held_back", "repaired_at")
    readonly_fields = ("room", "held_back")
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

    @admin.display(description=_("held back"))
    def held_back(self, limiter: WorkflowLimiter) -> SafeString:
        """The scheduled steps the limiter holds back now, counted for the page's rows, linked to their list."""
        count = getattr(limiter, HELD_BACK_COUNT, None)
        if count is None:  # its own page: counted alone
            count = held_back_by([limiter], clock.now()).get(limiter.name, 0)
        return held_back_link(self.admin_site.name, limiter.name, count)

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The list, each of its page's limiters given its held-back steps' count (one grouped read for the page)."""
        changelist = super().get_changelist_instance(request)
        page = list(changelist.result_list)
        counts = held_back_by(page, clock.now())
        for limiter in page:
            setattr(limiter, HELD_BACK_COUNT, counts.get(limiter.name, 0))
        changelist.result_list = page
        return changelist
