"""The operator console: runs, attempts, events, signals and dispatchers, read only.

Nothing here writes a row itself. The actions (bulk on the runs list, buttons on a run's
page) call the public verbs user code calls, with the admin user's username as ``actor``,
each behind its own permission (``WorkflowRun.Meta.permissions``). The dashboard is at
``<admin>/pgbus_workflows/workflowrun/dashboard/``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Model, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext_lazy as _

from .. import clock
from ..models import Dispatcher, FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from ..sql.counting import distinct_values
from .filters import (
    EventKindFilter,
    FinishedWithinFilter,
    RunStatusFilter,
    StepClassFilter,
    StuckFilter,
    WorkflowClassFilter,
)
from .operations import OPERATIONS, Operation
from .paging import ScaledChangeList, workflow_id_range
from .run_page import run_page_context
from .views import (
    bulk_operation,
    change_url,
    dashboard_context,
    operation_view,
    pretty_json,
    status_badge,
    subject_link,
)

# -- shared ---------------------------------------------------------------------------------------


class ReadOnlyAdmin(ScaledChangeList):
    """Engine rows are written by the services only: nobody adds, edits or deletes them here.

    Their lists count, sort and search through indexes only (``admin_paging``).
    """

    class Media:
        css = {"all": ("pgbus_workflows/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        # Fields shown through a display method (JSON in <pre>) are excluded in their raw form.
        hidden = set(self.exclude or ())
        return [f.name for f in self.opts.fields if f.name not in hidden] + list(self.readonly_fields)

    @admin.display(description=_("run"), ordering="run")
    def run_link(self, obj: Any) -> SafeString:
        """The attempt's, event's or signal's run, linked to its page."""
        url = change_url(self.admin_site.name, "workflowrun", obj.run_id)
        return format_html('<a href="{}">{} {}</a>', url, obj.run.workflow_class, str(obj.run.workflow_id)[:8])


# -- runs ----------------------------------------------------------------------------------------


#: The run page's header, all read-only.
RUN_FIELDS: tuple[str, ...] = ("workflow_id", "workflow_class", "subject", "coloured_status", "current_step")
RUN_FIELDS += ("paused_reason", "arguments_json", "idempotency_key", "allow_multiple", "rerun_of_link")
RUN_FIELDS += ("schedule_link", "scheduled_for")
RUN_READONLY: tuple[str, ...] = ("short_id", "subject", "coloured_status", "attempt", "age", "arguments_json")
RUN_READONLY += ("rerun_of_link", "schedule_link")


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyAdmin):
    """Runs: the changelist, the run page with its timeline, the actions and the dashboard."""

    list_display = (
        "short_id",
        "workflow_class",
        "subject",
        "coloured_status",
        "current_step",
        "attempt",
        "started_at",
        "status_changed_at",
        "age",
    )
    list_display_links = ("short_id",)
    list_filter = (WorkflowClassFilter, RunStatusFilter, StuckFilter)
    search_fields = ("workflow_id", "subject_id", "idempotency_key")
    search_help_text = _("A workflow id (or its first 8 hex digits or more), a subject id, or an idempotency key.")
    sortable_by = ("short_id",)
    list_per_page = 50
    actions = ["pause_runs", "resume_runs", "cancel_runs", "rerun_runs", "run_now_runs", "skip_runs"]
    fieldsets = (
        (None, {"fields": RUN_FIELDS}),
        (
            _("Times"),
            {"fields": ("created_at", "started_at", "status_changed_at", "finished_at"), "classes": ["collapse"]},
        ),
    )
    readonly_fields = RUN_READONLY

    def search_condition(self, term: str) -> Q:
        """Runs whose workflow id begins with ``term``, or whose subject id or idempotency key is it.

        Exact, not ``icontains``: each part is served by an index, the subject id and the key
        by naming every stored subject type and class (the first columns of their indexes).
        """
        found = Q(subject_id=term, subject_type__in=distinct_values(WorkflowRun, "subject_type"))
        found |= Q(idempotency_key=term, workflow_class__in=distinct_values(WorkflowRun, "workflow_class"))
        id_range = workflow_id_range(term)
        return found | Q(workflow_id__range=id_range) if id_range else found

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # A schedule's page links to its runs (no sidebar filter: there may be thousands of schedules).
        return lookup == "schedule__id__exact" or super().lookup_allowed(lookup, value, request)  # type: ignore[arg-type]

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        # One subquery, not one query per row: the changelist's cost does not grow with the page.
        latest = WorkflowStep.objects.filter(run_id=OuterRef("pk")).order_by("-pk").values("attempt")[:1]
        runs: QuerySet[WorkflowRun] = super().get_queryset(request)
        return runs.annotate(latest_attempt=Subquery(latest))

    # columns

    @admin.display(description=_("run"), ordering="workflow_id")  # the unique index orders it
    def short_id(self, run: WorkflowRun) -> SafeString:
        return format_html('<span title="{}">{}</span>', run.workflow_id, str(run.workflow_id)[:8])

    @admin.display(description=_("subject"))
    def subject(self, run: WorkflowRun) -> str:
        return subject_link(self.admin_site, run.subject_type, run.subject_id)

    @admin.display(description=_("status"), ordering="status")
    def coloured_status(self, run: WorkflowRun) -> SafeString:
        return status_badge(run.status, run.get_status_display())

    @admin.display(description=_("attempt"), ordering="latest_attempt")
    def attempt(self, run: WorkflowRun) -> Any:
        return getattr(run, "latest_attempt", None) or "-"

    @admin.display(description=_("age"), ordering="-created_at")
    def age(self, run: WorkflowRun) -> str:
        return timesince(run.created_at, depth=1)

    @admin.display(description=_("arguments"))
    def arguments_json(self, run: WorkflowRun) -> SafeString:
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(run.arguments))

    @admin.display(description=_("schedule"))
    def schedule_link(self, run: WorkflowRun) -> Any:
        if run.schedule_id is None:
            return "-"
        url = change_url(self.admin_site.name, "workflowschedule", run.schedule_id)
        return format_html('<a href="{}">{}</a>', url, run.schedule)

    @admin.display(description=_("rerun of"))
    def rerun_of_link(self, run: WorkflowRun) -> Any:
        if run.rerun_of is None:
            return "-"
        original = WorkflowRun.objects.filter(workflow_id=run.rerun_of).only("pk").first()
        if original is None:
            return str(run.rerun_of)
        return format_html(
            '<a href="{}">{}</a>', change_url(self.admin_site.name, "workflowrun", original.pk), run.rerun_of
        )

    # actions: each confirms with a reason, then calls the verb on every selected run

    @admin.action(permissions=["pause"], description=_("Pause selected runs"))
    def pause_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        return bulk_operation(self, request, queryset, "pause")

    @admin.action(permissions=["pause"], description=_("Resume selected runs"))
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        return bulk_operation(self, request, queryset, "resume")

    @admin.action(permissions=["cancel"], description=_("Cancel selected runs"))
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        return bulk_operation(self, request, queryset, "cancel")

    @admin.action(permissions=["rerun"], description=_("Rerun selected runs"))
    def rerun_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        return bulk_operation(self, request, queryset, "rerun")

    @admin.action(permissions=["run_now"], description=_("Run the scheduled step of selected runs now"))
    def run_now_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        return bulk_operation(self, request, queryset, "run_now")

    @admin.action(permissions=["skip"], description=_("Skip the current step of selected runs"))
    def skip_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        return bulk_operation(self, request, queryset, "skip")

    def _has(self, request: HttpRequest, permission: str, obj: Model | None) -> bool:
        """The model permission, or (for object-level backends) the permission on ``obj``."""
        codename = f"pgbus_workflows.{permission}_workflowrun"
        return request.user.has_perm(codename) or (obj is not None and request.user.has_perm(codename, obj))

    def has_pause_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Pause and resume."""
        return self._has(request, "pause", obj)

    def has_cancel_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return self._has(request, "cancel", obj)

    def has_rerun_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return self._has(request, "rerun", obj)

    def has_run_now_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return self._has(request, "run_now", obj)

    def has_skip_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Skip the current step, and resume at a chosen step."""
        return self._has(request, "skip", obj)

    def has_signal_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return self._has(request, "signal", obj)

    def may_operate(self, request: HttpRequest, op: Operation, run: WorkflowRun | None = None) -> bool:
        """Whether the user may run ``op`` (on ``run``): its ``has_<permission>_permission``, and,
        on a run, the view permission on it too. The menu, the buttons, the forms and the bulk
        actions all ask this, so overriding one ``has_<x>_permission`` changes all of them."""
        allowed = getattr(self, f"has_{op.permission}_permission")(request, run)
        return bool(allowed) and (run is None or self.has_view_permission(request, run))

    # views

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        urls = [path("dashboard/", wrap(self.dashboard_view), name=f"{prefix}_dashboard")]
        urls += [
            path(f"<path:object_id>/{verb}/", wrap(partial(self.operation_view, verb=verb)), name=f"{prefix}_{verb}")
            for verb in OPERATIONS
        ]
        return urls + super().get_urls()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Django drops an action the user may not run with a "No action selected." message;
        # an operator console refuses it outright, so that a forged POST is visibly denied.
        for action in request.POST.getlist("action") if request.method == "POST" else []:
            verb = action.removesuffix("_runs")
            if action.endswith("_runs") and verb in OPERATIONS and not self.may_operate(request, OPERATIONS[verb]):
                raise PermissionDenied
        dashboard = reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_dashboard")
        return super().changelist_view(request, {"dashboard_url": dashboard, **(extra_context or {})})

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        run = self.get_object(request, unquote(object_id))
        if run is not None and self.has_view_permission(request, run):
            extra_context = {**run_page_context(self, request, run), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context)

    def operation_view(self, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
        """A run page's button: the verb's form, then the verb (403 without its permission)."""
        return operation_view(self, request, unquote(object_id), verb)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """Runs by class, status and stuck reason, live dispatchers, the last hour's attempts."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "media": self.media,
            "title": _("Workflows dashboard"),
            "opts": self.opts,
            **dashboard_context(self.admin_site, request, clock.now()),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/pgbus_workflows/dashboard.html", context)


# -- attempts, events, signals, dispatchers ------------------------------------------------------


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
    list_filter = (StepClassFilter, "status", FinishedWithinFilter)
    sortable_by = ("id",)
    search_fields = ("run__workflow_id",)
    list_select_related = ("run",)
    readonly_fields = ("output_json", "traceback_text")
    exclude = ("output", "traceback")

    @admin.display(description=_("status"), ordering="status")
    def coloured_status(self, step: WorkflowStep) -> SafeString:
        return status_badge(step.status, step.get_status_display())

    @admin.display(description=_("output"))
    def output_json(self, step: WorkflowStep) -> SafeString:
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(step.output))

    @admin.display(description=_("traceback"))
    def traceback_text(self, step: WorkflowStep) -> SafeString:
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

    @admin.display(description=_("details"))
    def details_json(self, event: WorkflowEvent) -> SafeString:
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(event.details))


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
        return status_badge(signal.status, signal.get_status_display())

    @admin.display(description=_("payload"))
    def payload_json(self, signal: WorkflowSignal) -> SafeString:
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
        return status_badge(job.status, job.get_status_display())

    @admin.display(description=_("arguments"))
    def arguments_json(self, job: FanOutJob) -> SafeString:
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(job.arguments))

    @admin.display(description=_("result"))
    def result_json(self, job: FanOutJob) -> SafeString:
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(job.result))


# Registers the schedules' admin (a module of its own) with this one.
from . import schedules  # noqa: E402, F401
