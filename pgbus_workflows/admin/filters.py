"""The admin's list filters: by class, by status, by what a run is stuck on, by when it finished,
by the limiter that holds a step back.

None of them reads a table to list its choices (no ``SELECT DISTINCT``): classes come from
the registry and from the class index, one probe per class; the rest from the code. Each
filters on an indexed column, or narrows by class so that the (class, status) index serves it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..dsl.declared import registry
from ..models import NOTABLE_EVENT_KINDS, WorkflowRun
from ..services.limiters import held_back_steps
from ..services.stuck import STUCK_REASONS, stuck_querysets
from ..sql import clock
from ..sql.counting import distinct_values
from ..states import RunStatus


class WorkflowClassFilter(admin.SimpleListFilter):
    """Runs (or their attempts) of one workflow class: registered classes and stored names."""

    title = _("workflow class")
    parameter_name = "workflow_class"
    lookup = "workflow_class"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The stored class names and the registered ones, sorted."""
        stored = set(distinct_values(WorkflowRun, "workflow_class"))
        names = sorted(stored | {cls.name for cls in registry.classes()})
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The rows of the chosen class (``lookup`` is the path to it), or every row when none is chosen."""
        if self.value():
            return queryset.filter(**{self.lookup: self.value()})
        return queryset


class StepClassFilter(WorkflowClassFilter):
    """Attempts of runs of one workflow class."""

    lookup = "run__workflow_class"


class RunStatusFilter(admin.SimpleListFilter):
    """Runs by status, as ``?status=paused`` (the dashboard links here)."""

    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        """Every run status, in the code's order."""
        return list(RunStatus.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The runs of the chosen status, reached through the (class, status) index."""
        if not self.value():
            return queryset
        # Status is the second column of the (class, status) index: naming every stored class
        # keeps every row and lets the planner reach a rare status through that index.
        classes = distinct_values(WorkflowRun, "workflow_class")
        return queryset.filter(status=self.value(), workflow_class__in=classes)


class StuckFilter(admin.SimpleListFilter):
    """Runs stuck for one reason, with the queries the sweep's gauge counts."""

    title = _("stuck")
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Every reason the sweep counts a run as stuck for, in words."""
        return [(reason, reason.replace("_", " ")) for reason in STUCK_REASONS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The runs stuck for the chosen reason; an unknown reason is an invalid lookup."""
        reason = self.value()
        if not reason:
            return queryset
        if reason not in STUCK_REASONS:
            raise IncorrectLookupParameters(f"Unknown stuck reason {reason!r}")
        classes = distinct_values(WorkflowRun, "workflow_class")
        return queryset.filter(pk__in=stuck_querysets(clock.now(), classes)[reason].values("pk"))


class FinishedWithinFilter(admin.SimpleListFilter):
    """Attempts that finished recently (the dashboard's "last hour" and the insights' window link here)."""

    title = _("finished within")
    parameter_name = "finished_within"
    periods = {"1h": 1, "6h": 6, "24h": 24, "7d": 24 * 7}  # the insights page's windows

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        """The windows offered: the last hour, 6 hours, 24 hours and 7 days."""
        return [
            ("1h", _("the last hour")),
            ("6h", _("the last 6 hours")),
            ("24h", _("the last 24 hours")),
            ("7d", _("the last 7 days")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The attempts that finished within the chosen window; every attempt when none is chosen."""
        hours = self.periods.get(self.value() or "")
        if hours is None:
            return queryset
        return queryset.filter(finished_at__gte=clock.now() - timedelta(hours=hours))


class EventKindFilter(admin.SimpleListFilter):
    """Events of one notable kind (a verb, a failure, a stall, a timeout, a skip).

    The choices are the code's (``models.NOTABLE_EVENT_KINDS``), served by the partial index
    ``pgbus_wf_event_notable``; routine kinds are not offered (they are most of the table).
    """

    title = _("kind")
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The notable event kinds, in words."""
        return [(kind, kind.replace("_", " ")) for kind in NOTABLE_EVENT_KINDS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The events of the chosen kind; a kind not offered is an invalid lookup."""
        kind = self.value()
        if not kind:
            return queryset
        if kind not in NOTABLE_EVENT_KINDS:
            raise IncorrectLookupParameters(f"Not a kind this list filters by: {kind!r}")
        return queryset.filter(kind=kind)


class HeldBackByFilter(admin.SimpleListFilter):
    """The scheduled attempts one limiter holds back (``?held_back_by=concurrency:account:42``).

    The limiters list links each key here. No choice is listed (keys are unbounded): the
    filter shows the chosen limiter only. Parked attempts are read through the parked index.
    """

    title = _("held back by")
    parameter_name = "held_back_by"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The chosen limiter alone, when one is chosen (so the filter shows what it narrows to)."""
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The attempts the chosen limiter holds back now, or every attempt when none is chosen."""
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(held_back_steps(value, clock.now()))
