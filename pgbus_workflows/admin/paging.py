"""Changelists that stay fast on a million runs: estimated counts, indexed sorting and search.

Django's changelist counts its rows twice (the filtered list and the whole table) with
``COUNT(*)``, which reads every row. Here the filtered count is exact up to
``sql.counting.EXACT_UP_TO`` (counted in the page's own order, so the index the page walks
serves it) and the planner's estimate above it, shown as "about N" rounded to two significant
digits, or "more than N" when the planner knows no more than was counted; the whole table is
not counted (``show_full_result_count = False``). Facet counts (``?_facets``) would count
every filter choice and are never shown. Sorting is offered on indexed columns only, and
search finds workflow ids by the unique index (:func:`workflow_id_range`), never by a
``LIKE '%...%'`` that reads every row.
"""

from __future__ import annotations

import uuid
from functools import cached_property
from typing import Any, Literal, cast

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import EmptyPage, Page, PageNotAnInteger, Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.formats import number_format
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..models import WorkflowRun
from ..sql.counting import EXACT_UP_TO, estimated_count
from .replica import on_read_database

#: How deep (in pages) an estimated list goes: the page at this depth walks ``per_page`` x
#: this many index entries (5,000 with 50 a page), never the whole table.
DEEPEST_PAGE = 100


def count_label(count: int, estimated: bool, exact_up_to: int = EXACT_UP_TO) -> str:
    """How a count reads, with thousands separators: exact ("1,050"), "about 1,200,000" (an
    estimate, to two significant digits: its later digits mean nothing), or "more than 1,000"
    (the planner guessed no more than the ``exact_up_to + 1`` rows counted)."""
    if not estimated:
        return number_format(count, force_grouping=True)
    if count <= exact_up_to + 1:
        return gettext("more than %(count)s") % {"count": number_format(exact_up_to, force_grouping=True)}
    unit = 10 ** max(0, len(str(count)) - 2)
    rounded = (count + unit // 2) // unit * unit
    return gettext("about %(count)s") % {"count": number_format(rounded, force_grouping=True)}


class EstimatedCountPaginator(Paginator):
    """A paginator whose count is exact when small and the planner's estimate when large.

    ``estimated`` says which; an estimated count does not cut a page short or refuse a
    page number past it (the estimate may be low): a page past the end is empty. A page
    is read with ``OFFSET``, which walks every row before it, so an estimated list goes
    ``deepest_page`` pages deep at most (a filter or a search narrows it further) and its
    page links stop there: no link to the millionth row.
    """

    exact_up_to = EXACT_UP_TO
    deepest_page = DEEPEST_PAGE

    @cached_property
    def _counted(self) -> tuple[int, bool]:
        return estimated_count(cast("QuerySet[Any]", self.object_list), self.exact_up_to)

    @cached_property
    def count(self) -> int:
        """The exact count up to ``exact_up_to``, else the planner's estimate."""
        return int(self._counted[0])

    @property
    def estimated(self) -> bool:
        """Whether ``count`` is the planner's estimate."""
        return self._counted[1]

    @property
    def count_text(self) -> str:
        """``count`` as the list says it (:func:`count_label`)."""
        return count_label(self.count, self.estimated, self.exact_up_to)

    def validate_number(self, number: Any) -> int:
        """The page number as an int; an estimated list takes 1 to ``deepest_page``, even past its estimate."""
        if not self.estimated:
            return super().validate_number(number)
        try:
            page = int(number)
        except (TypeError, ValueError):
            raise PageNotAnInteger(_("That page number is not an integer")) from None
        if page < 1:
            raise EmptyPage(_("That page number is less than 1"))
        if page > self.deepest_page:
            raise EmptyPage(_("That page is too deep: narrow the list with a filter or a search"))
        return page

    def get_elided_page_range(self, number: Any = 1, *, on_each_side: int = 3, on_ends: int = 2) -> Any:
        """Django's page links; for an estimated count, the first pages and those around
        ``number``, up to ``deepest_page`` (the estimate's last pages are not offered)."""
        if not self.estimated:
            yield from super().get_elided_page_range(number, on_each_side=on_each_side, on_ends=on_ends)
            return
        number = self.validate_number(number)
        last = min(self.num_pages, self.deepest_page)
        shown = {*range(1, on_ends + 1), *range(number - on_each_side, number + on_each_side + 1)}
        previous = 0
        for page in sorted(p for p in shown if 1 <= p <= last):
            if page > previous + 1:
                yield self.ELLIPSIS
            yield page
            previous = page
        if previous < last:
            yield self.ELLIPSIS

    def page(self, number: Any) -> Page:
        """One page of rows; an estimated list's is a plain slice, empty past the end of the rows."""
        if not self.estimated:
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        return Page(self.object_list[bottom : bottom + self.per_page], number, self)


#: The shortest start of a workflow id a search looks up (the 8 characters the runs list shows).
MIN_ID_PREFIX = 8


def workflow_id_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The range of workflow ids that begin with ``text`` (8 to 32 hex digits, dashes ignored), or None.

    A range, not a ``LIKE``: the unique index on ``workflow_id`` serves it.
    """
    digits = text.strip().lower().replace("-", "")
    if not MIN_ID_PREFIX <= len(digits) <= 32 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


class IndexedOrderChangeList(ChangeList):
    """A changelist that sorts only by the columns of ``sortable_by``, even when the URL asks
    for another (``?o=4``): sorting a million runs by an unindexed column reads them all."""

    def get_ordering_field(self, field_name: Any) -> Any:
        """The column ``field_name`` sorts by, or None when it is not in ``sortable_by``."""
        if self.sortable_by is not None and field_name not in self.sortable_by:
            return None
        return super().get_ordering_field(field_name)

    def get_ordering_field_columns(self) -> dict[int, Literal["desc", "asc"]]:
        """The columns whose headers show a sort order: only those in ``sortable_by``, as the list sorts."""
        columns = super().get_ordering_field_columns()
        if self.sortable_by is None:
            return columns
        return {i: order for i, order in columns.items() if self.list_display[i] in self.sortable_by}


class ScaledChangeList(admin.ModelAdmin):
    """A ModelAdmin whose changelist counts nothing large and sorts only on indexed columns.

    Subclasses set ``sortable_by`` to the columns an index orders (the primary key walk of
    the default ordering is always indexed). The search box (``search_fields`` set, to show
    it) takes a run's workflow id or its start (``run_lookup``: the path to ``workflow_id``).
    """

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    search_help_text = _("A workflow id, or its first 8 hex digits or more.")
    run_lookup = "run__workflow_id"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The list; a GET reads ``READ_DATABASE`` and says how far behind it is (``replica.on_read_database``)."""
        view = super().changelist_view
        return on_read_database(request, lambda read: view(request, {**read, **(extra_context or {})}))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        """The changelist that sorts by indexed columns only (:class:`IndexedOrderChangeList`)."""
        return IndexedOrderChangeList

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], search_term: str) -> Any:
        """The rows :meth:`search_condition` finds (no duplicates to remove); every row for a blank term."""
        if not search_term.strip():
            return queryset, False
        return queryset.filter(self.search_condition(search_term.strip())), False

    def search_condition(self, term: str) -> Q:
        """The rows a search term finds: those of the run whose workflow id begins with it.

        The runs are looked up first (the workflow id's index), then the rows by their run's
        key. Joined in one query, the planner guessed a range of UUIDs, which it cannot place
        in its histogram, at 0.5 % of all runs whenever the range held one of the histogram's
        bounds (about one run in 300), and read the whole table of rows to hash-join them.
        """
        found = workflow_id_range(term)
        if not found:
            return Q(pk__in=[])
        relation = self.run_lookup.removesuffix("__workflow_id")
        runs = WorkflowRun.objects.filter(workflow_id__range=found).values_list("pk", flat=True)
        return Q(**{f"{relation}__in": list(runs)})
