"""The engine's rows in the operator console, read only: attempts, events, signals, dispatchers, jobs.

``ReadOnlyAdmin`` is the base of every engine row's admin (the runs' too): nobody adds,
edits or deletes a row here, since only the services write them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Dispatcher, FanOutJob, WorkflowEvent, WorkflowSignal, WorkflowStep
from .display import change_url, pretty_json, status_badge
from .filters import EventKindFilter, FinishedWithinFilter, HeldBackByFilter, StepClassFilter
from .operations import may_view
from .paging import ScaledChangeList

#: The events whose reason the engine writes from an error's message, and the details that quote one.
ERROR_REASON_KINDS = frozenset({"step_failed", "sweep_failed"})
ERROR_DETAILS = ("error_message", "cause")

#: What stands for an error's text a user may not see.
WITHHELD = _("Withheld: it may hold a step's error, shown with the permission to view workflow steps.")


def paused_reason_shown(reason: str, errors: bool) -> str:
    """A run's pause reason as a user sees it: :data:`WITHHELD` in its place unless ``errors``.

    A run an error paused holds the step's error text there, which the attempts' view
    permission guards (as :func:`event_shown`); an empty reason stays empty, so a user can
    tell a run with no reason from one whose reason is withheld.
    """
    return reason if errors or not reason else str(WITHHELD)


def event_shown(event: WorkflowEvent, errors: bool) -> tuple[str, dict[str, Any] | None]:
    """The event's reason and details as a user sees them: without an error's text unless ``errors``.

    A step's error text is the attempts' to show (their view permission guards it): the reason
    of a failure the engine recorded and the details that quote an error give way to
    :data:`WITHHELD` for a user who may not view attempts; the error's class stays.
    """
    reason, details = event.reason, event.details
    if errors:
        return reason, details
    if reason and event.kind in ERROR_REASON_KINDS:
        reason = str(WITHHELD)
    if isinstance(details, dict) and any(details.get(key) for key in ERROR_DETAILS):
        details = {key: str(WITHHELD) if key in ERROR_DETAILS and value else value for key, value in details.items()}
    return reason, details


class ReadOnlyAdmin(ScaledChangeList):
    """Engine rows are written by the services only: nobody adds, edits or deletes them here.

    Their lists count, sort and search through indexes only (``admin.paging``).
    """

    class Media:
        css = {"all": ("pgbus_workflows/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Never: engine rows are written by the services only."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Never: an engine row's page is read only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Never: nobody deletes an engine row here."""
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        """Every field, read only: the model's but those in ``exclude``, then ``readonly_fields``."""
        # Fields shown through a display method (JSON in <pre>) are excluded in their raw form.
        hidden = set(self.exclude or ())
        return [f.name for f in self.opts.fields if f.name not in hidden] + list(self.readonly_fields)

    @admin.display(description=_("run"), ordering="run")
    def run_link(self, obj: Any) -> SafeString:
        """The attempt's, event's or signal's run, linked to its page."""
        url = change_url(self.admin_site.name, "workflowrun", obj.run_id)
        return format_html('<a href="{}">{} {}</a>', url, obj.run.workflow_class, str(obj.run.workflow_id)[:8])


@admin.register(WorkflowStep)
class WorkflowStepAdmin(ReadOnlyAdmin):
    """Step attempts; a run's page links here filtered by run (``?run__id__exact=``)."""

    list_display = (
        "id",
        "run_link",
        "step_name",
        "attempt",
        "coloured_status",
        "outcome",
        "queue",
        "scheduled_at",
        "finished_at",
        "error_class",
    )
    list_filter = (StepClassFilter, "status", FinishedWithinFilter, HeldBackByFilter)
    sortable_by = ("id",)
    search_fields = ("run__workflow_id",)
    list_select_related = ("run",)
    readonly_fields = ("output_json", "traceback_text")
    exclude = ("output", "traceback")

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Django's allowed lookups, plus ``step_name``: the insights page links each step's counts here."""
        return lookup == "step_name" or super().lookup_allowed(lookup, value, request)  # type: ignore[arg-type]

    @admin.display(description=_("status"), ordering="status")
    def coloured_status(self, step: WorkflowStep) -> SafeString:
        """The attempt's status as a coloured badge."""
        return status_badge(step.status, step.get_status_display())

    @admin.display(description=_("output"))
    def output_json(self, step: WorkflowStep) -> SafeString:
        """The attempt's output as indented JSON."""
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(step.output))

    @admin.display(description=_("traceback"))
    def traceback_text(self, step: WorkflowStep) -> SafeString:
        """The attempt's traceback, or "-" when it raised nothing."""
        return format_html('<pre class="pgbus-json">{}</pre>', step.traceback or "-")


@admin.register(WorkflowEvent)
class WorkflowEventAdmin(ReadOnlyAdmin):
    """The audit trail: every transition and every operator verb, with its actor and reason."""

    list_display = ("id", "created_at", "run_link", "kind", "actor", "reason", "from_status", "to_status")
    list_filter = (EventKindFilter,)
    sortable_by = ("id",)
    search_fields = ("run__workflow_id",)
    list_select_related = ("run",)
    readonly_fields = ("details_json",)
    exclude = ("details",)

    def get_list_display(self, request: HttpRequest) -> Any:
        """The list's columns; the reason without an error's text for a user who may not view attempts."""
        if may_view(self.admin_site, request, WorkflowStep):
            return self.list_display
        return tuple("reason_shown" if column == "reason" else column for column in self.list_display)

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        """The page's fields; the reason and details without an error's text for a user who may not view attempts."""
        fields = super().get_readonly_fields(request, obj)
        if may_view(self.admin_site, request, WorkflowStep):
            return fields
        swap = {"reason": "reason_shown", "details_json": "details_shown"}
        return [swap.get(field, field) for field in fields]

    def get_exclude(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """The raw fields left out of the page: the reason too where it shows without an error's text."""
        exclude = tuple(super().get_exclude(request, obj) or ())
        return exclude if may_view(self.admin_site, request, WorkflowStep) else (*exclude, "reason")

    @admin.display(description=_("details"))
    def details_json(self, event: WorkflowEvent) -> SafeString:
        """The event's details as indented JSON."""
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(event.details))

    @admin.display(description=_("reason"))
    def reason_shown(self, event: WorkflowEvent) -> str:
        """The event's reason, an error's text withheld (:func:`event_shown`)."""
        return event_shown(event, errors=False)[0]

    @admin.display(description=_("details"))
    def details_shown(self, event: WorkflowEvent) -> SafeString:
        """The event's details as indented JSON, an error's text withheld (:func:`event_shown`)."""
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(event_shown(event, errors=False)[1]))


@admin.register(WorkflowSignal)
class WorkflowSignalAdmin(ReadOnlyAdmin):
    """Signals delivered to runs, pending until a step consumes them."""

    list_display = ("id", "received_at", "run_link", "name", "coloured_status", "actor", "idempotency_key")
    list_filter = ("status",)
    sortable_by = ("id",)
    search_fields = ("run__workflow_id",)
    list_select_related = ("run",)
    readonly_fields = ("payload_json",)
    exclude = ("payload",)

    @admin.display(description=_("status"), ordering="status")
    def coloured_status(self, signal: WorkflowSignal) -> SafeString:
        """The signal's status as a coloured badge."""
        return status_badge(signal.status, signal.get_status_display())

    @admin.display(description=_("payload"))
    def payload_json(self, signal: WorkflowSignal) -> SafeString:
        """The signal's payload as indented JSON."""
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(signal.payload))


@admin.register(Dispatcher)
class DispatcherAdmin(ReadOnlyAdmin):
    """The dispatcher processes that heartbeat (dead ones are forgotten by the sweep)."""

    list_display = ("name", "hostname", "pid", "queues", "concurrency", "workers_alive", "started_at", "heartbeat_at")


@admin.register(FanOutJob)
class FanOutJobAdmin(ReadOnlyAdmin):
    """Fan-out jobs; a run's timeline links here filtered by step (``?step__id__exact=``)."""

    list_display = ("id", "run_link", "step", "index", "function", "coloured_status", "attempts", "finished_at")
    list_filter = ("status",)
    sortable_by = ("id",)
    search_fields = ("run__workflow_id",)
    list_select_related = ("run", "step")
    readonly_fields = ("arguments_json", "result_json")
    exclude = ("arguments", "result")

    @admin.display(description=_("status"), ordering="status")
    def coloured_status(self, job: FanOutJob) -> SafeString:
        """The job's status as a coloured badge."""
        return status_badge(job.status, job.get_status_display())

    @admin.display(description=_("arguments"))
    def arguments_json(self, job: FanOutJob) -> SafeString:
        """The job's arguments as indented JSON."""
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(job.arguments))

    @admin.display(description=_("result"))
    def result_json(self, job: FanOutJob) -> SafeString:
        """The job's result as indented JSON."""
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(job.result))
