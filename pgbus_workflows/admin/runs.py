"""The runs in the operator console: the list, the run page, the actions and the dashboard.

Nothing here writes a row itself. The actions (bulk on the runs list, buttons on a run's
page) call the public verbs user code calls, with the admin user's username as ``actor``,
each behind its own permission (``WorkflowRun.Meta.permissions``, asked through
``operations.OperatedAdmin``). The dashboard is at
``<admin>/pgbus_workflows/workflowrun/dashboard/``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.db.models.expressions import Combinable
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext_lazy as _

from ..models import WorkflowRun, WorkflowStep
from ..sql import clock
from ..sql.counting import distinct_values
from .dashboard import dashboard_context
from .display import change_url, pretty_json, status_badge, subject_link
from .filters import RunStatusFilter, StuckFilter, WorkflowClassFilter
from .holds import class_hold, hold_view, holds_context
from .insights import insights_context
from .operations import OPERATIONS, OperatedAdmin, bulk_operation, may_view, operation_view
from .paging import workflow_id_range
from .records import ReadOnlyAdmin, paused_reason_shown
from .replica import on_read_database
from .run_page import run_page_context

#: The run page's header, all read-only.
RUN_FIELDS: tuple[str, ...] = ("workflow_id", "workflow_class", "subject", "coloured_status", "current_step")
RUN_FIELDS += (
    "paused_reason",
    "arguments_json",
    "idempotency_key",
    "debounce_key",
    "allow_multiple",
    "rerun_of_link",
    "forked_from_link",
)
RUN_FIELDS += ("schedule_link", "scheduled_for", "started_by")
RUN_READONLY: tuple[str, ...] = ("short_id", "subject", "coloured_status", "attempt", "age", "arguments_json")
RUN_READONLY += ("rerun_of_link", "forked_from_link", "schedule_link", "started_by")


@admin.register(WorkflowRun)
class WorkflowRunAdmin(OperatedAdmin, ReadOnlyAdmin):
    """Runs: the changelist, the run page with its timeline, the actions and the dashboard."""

    list_display = (
        "short_id",
        "class_and_debounce_key",
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
    actions = ["pause_runs", "resume_runs", "cancel_runs", "rerun_runs", "fork_runs", "run_now_runs", "skip_runs"]
    fieldsets = (
        (None, {"fields": RUN_FIELDS}),
        (
            _("Times"),
            {"fields": ("created_at", "started_at", "status_changed_at", "finished_at"), "classes": ["collapse"]},
        ),
    )
    readonly_fields = (*RUN_READONLY, "paused_reason_withheld")

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
        """Django's allowed lookups, plus the two that other pages link with: a schedule's runs, a step's runs."""
        # A schedule's page links to its runs (no sidebar filter: there may be thousands of schedules),
        # the insights page to the runs at one step (with a class and a status: pgbus_wf_run_pipeline).
        allowed = lookup in ("schedule__id__exact", "current_step")
        return allowed or super().lookup_allowed(lookup, value, request)  # type: ignore[arg-type]

    def get_ordering(self, request: HttpRequest) -> list[str | Combinable] | tuple[str | Combinable, ...] | tuple[()]:
        """Newest first: by id, or a class's runs by their start (``pgbus_wf_run_class_started`` gives that order).

        Ordered by id, a class's list would walk the runs' primary key past every newer run of
        the other classes (a campaign's million runs started last, in front of an older class's),
        since the planner takes a class's runs to be spread evenly over the key; no other index
        gives the start's order, so it reads the class's own entries, newest first.
        """
        if request.GET.get(WorkflowClassFilter.parameter_name):
            return ("-started_at", "-id")
        return super().get_ordering(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowRun]:
        """The runs, each with the number of its latest attempt (``latest_attempt``)."""
        # One subquery, not one query per row: the changelist's cost does not grow with the page.
        latest = WorkflowStep.objects.filter(run_id=OuterRef("pk")).order_by("-pk").values("attempt")[:1]
        runs: QuerySet[WorkflowRun] = super().get_queryset(request)
        return runs.annotate(latest_attempt=Subquery(latest))

    # columns

    @admin.display(description=_("run"), ordering="workflow_id")  # the unique index orders it
    def short_id(self, run: WorkflowRun) -> SafeString:
        """The workflow id's first 8 characters, the whole id on hover."""
        return format_html('<span title="{}">{}</span>', run.workflow_id, str(run.workflow_id)[:8])

    @admin.display(description=_("workflow class"))
    def class_and_debounce_key(self, run: WorkflowRun) -> str:
        """The class, and under it the run's debounce key when it has one (a debounced class's start())."""
        if run.debounce_key is None:
            return run.workflow_class
        return format_html(
            '{}<div class="pgbus-muted pgbus-debounce-key" title="{}">{}</div>',
            run.workflow_class,
            _("debounce key"),
            run.debounce_key,
        )

    def get_fieldsets(self, request: HttpRequest, obj: WorkflowRun | None = None) -> Any:
        """The run page's fields; the debounce key only on a run that has one.

        The pause reason only for users who may view attempts: a run an error paused holds
        the step's error text there, which the attempts' view permission guards everywhere else.
        """
        fieldsets = super().get_fieldsets(request, obj)
        keyed = obj is not None and obj.debounce_key is not None
        swap: dict[Any, Any] = {}
        if not may_view(self.admin_site, request, WorkflowStep):
            swap["paused_reason"] = "paused_reason_withheld"
        return [
            (
                name,
                {
                    **options,
                    "fields": [swap.get(f, f) for f in options["fields"] if keyed or f != "debounce_key"],
                },
            )
            for name, options in fieldsets
        ]

    @admin.display(description=_("paused reason"))
    def paused_reason_withheld(self, run: WorkflowRun) -> Any:
        """In place of the pause reason for a user who may not view attempts: whether there is one."""
        return paused_reason_shown(run.paused_reason, errors=False) or "-"

    @admin.display(description=_("subject"))
    def subject(self, run: WorkflowRun) -> str:
        """The run's subject, linked to its admin page when its model has one."""
        return subject_link(self.admin_site, run.subject_type, run.subject_id)

    @admin.display(description=_("status"), ordering="status")
    def coloured_status(self, run: WorkflowRun) -> SafeString:
        """The run's status as a coloured badge."""
        return status_badge(run.status, run.get_status_display())

    @admin.display(description=_("attempt"), ordering="latest_attempt")
    def attempt(self, run: WorkflowRun) -> Any:
        """The number of the run's latest attempt, or "-" before its first."""
        return getattr(run, "latest_attempt", None) or "-"

    @admin.display(description=_("age"), ordering="-created_at")
    def age(self, run: WorkflowRun) -> str:
        """How long ago the run was created, in its largest unit ("3 hours")."""
        return timesince(run.created_at, depth=1)

    @admin.display(description=_("arguments"))
    def arguments_json(self, run: WorkflowRun) -> SafeString:
        """The run's arguments as indented JSON."""
        return format_html('<pre class="pgbus-json">{}</pre>', pretty_json(run.arguments))

    @admin.display(description=_("schedule"))
    def schedule_link(self, run: WorkflowRun) -> Any:
        """The schedule that started the run, linked to its page, or "-"."""
        if run.schedule_id is None:
            return "-"
        url = change_url(self.admin_site.name, "workflowschedule", run.schedule_id)
        return format_html('<a href="{}">{}</a>', url, run.schedule)

    @admin.display(description=_("started by"))
    def started_by(self, run: WorkflowRun) -> Any:
        """The actor of the run's ``started`` event, and the reason it gave (``Cls.started_by()``)."""
        audit = run.start_audit()
        if audit is None:
            return "-"
        actor, reason = audit
        return format_html('{}<div class="pgbus-muted">{}</div>', actor, reason) if reason else actor

    @admin.display(description=_("rerun of"))
    def rerun_of_link(self, run: WorkflowRun) -> Any:
        """The run this one reruns, linked to its page while it is stored, or "-"."""
        return self._run_link(run.rerun_of)

    @admin.display(description=_("forked from"))
    def forked_from_link(self, run: WorkflowRun) -> Any:
        """The run this one was forked from (its earlier steps' outputs are that run's), linked, or "-"."""
        return self._run_link(run.forked_from)

    def _run_link(self, workflow_id: Any) -> Any:
        """The run ``workflow_id`` linked to its page while it is stored, its id when it is gone, or "-"."""
        if workflow_id is None:
            return "-"
        original = WorkflowRun.objects.filter(workflow_id=workflow_id).only("pk").first()
        if original is None:
            return str(workflow_id)
        return format_html(
            '<a href="{}">{}</a>', change_url(self.admin_site.name, "workflowrun", original.pk), workflow_id
        )

    # actions: each confirms with a reason, then calls the verb on every selected run

    @admin.action(permissions=["pause"], description=_("Pause selected runs"))
    def pause_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        """Pause the selected runs, with the reason the operator gives."""
        return bulk_operation(self, request, queryset, "pause")

    @admin.action(permissions=["pause"], description=_("Resume selected runs"))
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        """Resume the selected runs, with the reason the operator gives."""
        return bulk_operation(self, request, queryset, "resume")

    @admin.action(permissions=["cancel"], description=_("Cancel selected runs"))
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        """Cancel the selected runs, with the reason the operator gives."""
        return bulk_operation(self, request, queryset, "cancel")

    @admin.action(permissions=["rerun"], description=_("Rerun selected runs"))
    def rerun_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        """Start each selected run again with its arguments, with the reason the operator gives."""
        return bulk_operation(self, request, queryset, "rerun")

    @admin.action(permissions=["rerun"], description=_("Fork selected runs at a step"))
    def fork_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        """Fork each selected run at the step the operator names, with the reason they give."""
        return bulk_operation(self, request, queryset, "fork")

    @admin.action(permissions=["run_now"], description=_("Run the scheduled step of selected runs now"))
    def run_now_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        """Make the scheduled step of each selected run due now, with the reason the operator gives."""
        return bulk_operation(self, request, queryset, "run_now")

    @admin.action(permissions=["skip"], description=_("Skip the current step of selected runs"))
    def skip_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> HttpResponse | None:
        """Skip the current step of each selected run, with the reason the operator gives."""
        return bulk_operation(self, request, queryset, "skip")

    # views

    def get_urls(self) -> list[URLPattern]:
        """The dashboard's, the insights' and each verb's URLs, then Django's own."""
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        urls = [path("dashboard/", wrap(self.dashboard_view), name=f"{prefix}_dashboard")]
        urls += [path("holds/", wrap(self.holds_view), name=f"{prefix}_holds")]
        urls += [path("insights/<path:workflow_class>/", wrap(self.insights_view), name="pgbus_workflows_insights")]
        urls += [
            path(f"<path:object_id>/{verb}/", wrap(partial(self.operation_view, verb=verb)), name=f"{prefix}_{verb}")
            for verb in OPERATIONS
        ]
        return urls + super().get_urls()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The runs list, with links to the dashboard and a class's insights; a forbidden action is a 403."""
        # Django drops an action the user may not run with a "No action selected." message;
        # an operator console refuses it outright, so that a forged POST is visibly denied.
        for action in request.POST.getlist("action") if request.method == "POST" else []:
            verb = action.removesuffix("_runs")
            if action.endswith("_runs") and verb in OPERATIONS and not self.may_operate(request, OPERATIONS[verb]):
                raise PermissionDenied
        site = self.admin_site.name
        links = {"dashboard_url": reverse(f"{site}:{self.opts.app_label}_{self.opts.model_name}_dashboard")}
        if request.GET.get("workflow_class"):
            links["insights_url"] = reverse(f"{site}:pgbus_workflows_insights", args=[request.GET["workflow_class"]])
        held = {"class_hold": class_hold(request.GET.get("workflow_class"))}  # the banner
        return super().changelist_view(request, {**links, **held, **(extra_context or {})})

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The run page, with its buttons and timeline (``run_page_context``) when the user may view it."""
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
        request.current_app = self.admin_site.name
        return on_read_database(request, partial(self._dashboard, request))

    def _dashboard(self, request: HttpRequest, read: dict[str, Any]) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "media": self.media,
            "title": _("Workflows dashboard"),
            "opts": self.opts,
            **dashboard_context(self.admin_site, request, clock.now()),
            **read,
            **holds_context(request),
            "holds_url": reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_holds"),
        }
        return TemplateResponse(request, "admin/pgbus_workflows/dashboard.html", context)

    def holds_view(self, request: HttpRequest) -> HttpResponse:
        """The dashboard's hold form and release buttons (POST; 403 without ``hold_workflowrun``)."""
        back = reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_dashboard")
        return hold_view(self, request, back)

    def insights_view(self, request: HttpRequest, workflow_class: str) -> HttpResponse:
        """One class's pipeline, step performance and funnel over a window (``?window=1h|6h|24h|7d``)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        request.current_app = self.admin_site.name
        return on_read_database(request, partial(self._insights, request, workflow_class))

    def _insights(self, request: HttpRequest, workflow_class: str, read: dict[str, Any]) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "media": self.media,
            "title": _("Insights: %(workflow_class)s") % {"workflow_class": workflow_class},
            "opts": self.opts,
            "dashboard_url": reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_dashboard"),
            **insights_context(self.admin_site, request, workflow_class, clock.now()),
            **read,
        }
        return TemplateResponse(request, "admin/pgbus_workflows/insights.html", context)
