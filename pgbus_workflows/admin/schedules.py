"""The schedules in the operator console: their next ticks, the cron in words, the last run.

The list shows each schedule's next fire time, its expression in words, its last run and
that run's status. A schedule's page has buttons for the verbs its state allows (pause,
resume, fire now), each behind its permission (``WorkflowSchedule.Meta.permissions``),
asking for a reason, and calling the same verbs user code calls (``services.schedules``)
with the admin user's username as ``actor``; its audit trail and a link to its runs.
Schedules added here are stored by ``Cls.add_schedule``; declared ones belong to the code:
they are read only and cannot be deleted here. A schedule starts runs with the arguments it
holds, so adding one needs the permission to start runs too (``add_workflowrun``), and firing
a ``cancel_previous`` schedule by hand needs the permission to cancel runs (``cancel_workflowrun``).
A schedule whose last tick failed shows a "failing" badge, and its page says why.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext_lazy as _

from ..dsl.declared import registry
from ..dsl.schedules import MAX_EVERY, Schedule
from ..exceptions import ConfigurationError, PayloadNotSerializable, PayloadTooLarge, WorkflowError
from ..models import WorkflowSchedule
from ..services import schedules as verbs
from ..sql import clock
from ..workflow import Workflow
from .display import change_url, changelist_url, status_badge
from .forms import ReasonForm

#: verb -> (the permission it needs, its button, what the message says it did).
SCHEDULE_OPERATIONS: dict[str, tuple[str, Any, Any]] = {
    "pause": ("pause", _("Pause"), _("paused")),
    "resume": ("pause", _("Resume"), _("resumed: its next tick is the first from now")),
    "fire_now": ("fire", _("Fire now"), _("fired")),
}
#: The add form's fields, and a schedule page's (read only).
ADD_FIELDS: tuple[str, ...] = (
    "workflow_class",
    "name",
    "cron",
    "every_seconds",
    "timezone",
    "arguments",
    "overlap",
    "catchup",
)
ADD_FIELDS += ("jitter_seconds",)
PAGE_FIELDS: tuple[str, ...] = (
    "name",
    "workflow_class",
    "expression",
    "in_words",
    "timezone",
    "arguments",
    "overlap",
    "catchup",
)
PAGE_FIELDS += ("jitter", "state", "next_fire", "last_fired_at", "last_run_link", "runs_link", "declared", "created_at")
PAGE_FIELDS += ("last_error", "last_error_at")
#: Adding a schedule lets its arguments start runs on a clock: the same permission as starting runs.
START_PERMISSION = "pgbus_workflows.add_workflowrun"
#: Firing a ``cancel_previous`` schedule by hand cancels its ongoing runs.
CANCEL_PERMISSION = "pgbus_workflows.cancel_workflowrun"
#: How many lines of a schedule's audit trail its page shows.
EVENTS_SHOWN = 50


class ScheduleReasonForm(ReasonForm):
    """Why the operator acts on a schedule: recorded in the schedule's audit trail."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["reason"].help_text = _("Recorded in the schedule's audit trail with your username.")


class AddScheduleForm(forms.ModelForm):
    """A schedule added at run time: the options of ``Schedule``, checked as ``Schedule`` checks them."""

    every_seconds = forms.IntegerField(
        label=_("Every (seconds)"), required=False, min_value=1, max_value=int(MAX_EVERY.total_seconds())
    )
    jitter_seconds = forms.IntegerField(
        label=_("Jitter (seconds)"), required=False, min_value=0, max_value=int(MAX_EVERY.total_seconds())
    )

    class Meta:
        model = WorkflowSchedule
        fields = ("workflow_class", "name", "cron", "timezone", "arguments", "overlap", "catchup")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        classes = [(cls.name, cls.name) for cls in registry.classes()]
        self.fields["workflow_class"] = forms.ChoiceField(label=_("Workflow class"), choices=classes)
        self.fields["name"].required = False
        self.fields["name"].help_text = _("Defaults to the expression.")
        self.fields["cron"].help_text = _("5 fields, in the time zone below; or leave empty and give Every.")
        self.schedule: Schedule | None = None

    def clean(self) -> dict[str, Any]:
        """The form's data, checked by building the ``Schedule`` it describes (kept as ``schedule``)."""
        data = super().clean() or {}
        every, jitter = data.get("every_seconds"), data.get("jitter_seconds")
        try:
            self.schedule = Schedule(
                data.get("cron") or None,
                every=None if every is None else timedelta(seconds=every),
                timezone=data.get("timezone") or "UTC",
                arguments=data.get("arguments") or {},
                name=data.get("name") or None,
                overlap=data.get("overlap") or "skip",
                catchup=data.get("catchup") or "latest",
                jitter=None if jitter is None else timedelta(seconds=jitter),
            )
        except ConfigurationError as error:
            raise ValidationError(str(error)) from None
        return data


@admin.register(WorkflowSchedule)
class WorkflowScheduleAdmin(admin.ModelAdmin):
    """Schedules: next ticks, the cron in words, last runs; pause, resume and fire now."""

    list_display = ("name", "workflow_class", "expression", "in_words", "next_fire", "last_run_link", "state")
    list_display_links = ("name",)
    list_filter = ("workflow_class", "paused", "declared")
    search_fields = ("name", "workflow_class")
    list_select_related = ("last_run",)
    list_per_page = 50
    readonly_fields = ("expression", "in_words", "next_fire", "last_run_link", "state", "runs_link")

    class Media:
        css = {"all": ("pgbus_workflows/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkflowSchedule]:
        """The schedules, each with its last run joined in the same query."""
        return super().get_queryset(request).select_related("last_run")

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """The add form (:class:`AddScheduleForm`) for a new schedule, Django's form for a stored one."""
        if obj is None:
            kwargs["form"] = AddScheduleForm
        return super().get_form(request, obj, change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """``ADD_FIELDS`` on the add form, ``PAGE_FIELDS`` on a schedule's page."""
        if obj is None:
            return ADD_FIELDS
        return PAGE_FIELDS

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """No field on the add form; every field on a schedule's page."""
        if obj is None:
            return ()
        return [f.name for f in self.opts.fields] + list(self.readonly_fields)

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Adding a schedule, and starting runs (:data:`START_PERMISSION`): its ticks start runs."""
        return super().has_add_permission(request) and bool(request.user.has_perm(START_PERMISSION))

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Never: a schedule changes through its verbs or its declaration."""
        return False  # a schedule changes through its verbs (or its declaration), never through a form

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Django's delete permission, but never for a declared schedule."""
        if isinstance(obj, WorkflowSchedule) and obj.declared:
            return False  # the next sync would bring it back: remove it from the class's schedules
        return super().has_delete_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Store the schedule through ``add_schedule``, as user code would."""
        cls = registry.get(form.cleaned_data["workflow_class"]) or Workflow
        try:
            row = verbs.add_schedule(cls, form.schedule, actor=request.user.get_username())
        except (ValueError, PayloadTooLarge, PayloadNotSerializable) as error:
            raise ValidationError(str(error)) from None
        obj.pk, obj._state.adding = row.pk, False

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None) -> Any:
        """The add form; a schedule ``add_schedule`` refuses (a taken name) goes back to the list with why."""
        try:
            return super().add_view(request, form_url, extra_context)
        except ValidationError as error:  # a taken name: said on the list, nothing was stored
            self.message_user(request, " ".join(error.messages), messages.ERROR)
            return HttpResponseRedirect(changelist_url(self.admin_site.name, "workflowschedule"))

    # columns

    @admin.display(description=_("expression"))
    def expression(self, schedule: WorkflowSchedule) -> str:
        """The schedule's cron expression, or its interval."""
        return schedule.expression

    @admin.display(description=_("in words"))
    def in_words(self, schedule: WorkflowSchedule) -> str:
        """The schedule in words."""
        return schedule.in_words

    @admin.display(description=_("next fire"), ordering="due_at")
    def next_fire(self, schedule: WorkflowSchedule) -> str:
        """When the schedule fires next and how soon (or how overdue), or why it does not ("paused")."""
        if not schedule.enabled:
            return str(_("only by hand (disabled in code)"))
        if schedule.paused:
            return str(_("paused"))
        if schedule.next_fire_at is None:
            return ""
        when = schedule.next_fire_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        now = clock.now()
        if schedule.next_fire_at <= now:  # no leader fired it yet (all dispatchers down?)
            return f"{when} ({_('due')} {timesince(schedule.next_fire_at, now, depth=1)} {_('ago')})"
        return f"{when} ({_('in')} {timeuntil(schedule.next_fire_at, now)})"

    @admin.display(description=_("last run"))
    def last_run_link(self, schedule: WorkflowSchedule) -> SafeString | str:
        """When the last run was scheduled for, linked to it, with its status; "-" before the first."""
        run = schedule.last_run
        if run is None:
            return "-"
        url = change_url(self.admin_site.name, "workflowrun", run.pk)
        when = run.scheduled_for.strftime("%Y-%m-%d %H:%M:%S") if run.scheduled_for else ""
        return format_html('<a href="{}">{}</a> {}', url, when, status_badge(run.status, run.get_status_display()))

    @admin.display(description=_("state"))
    def state(self, schedule: WorkflowSchedule) -> SafeString:
        """A badge: class not registered, failing, disabled, paused or active (the first that holds)."""
        if not registry.is_registered(schedule.workflow_class):
            return status_badge("cancelled", _("class not registered"))
        if schedule.last_error:
            return status_badge("failed", _("failing"))
        if not schedule.enabled:
            return status_badge("paused", _("disabled"))
        return status_badge("paused", _("paused")) if schedule.paused else status_badge("ready", _("active"))

    @admin.display(description=_("runs"))
    def runs_link(self, schedule: WorkflowSchedule) -> SafeString:
        """A link to the runs list showing this schedule's runs."""
        url = changelist_url(self.admin_site.name, "workflowrun", schedule__id__exact=schedule.pk)
        return format_html('<a href="{}">{}</a>', url, _("Runs of this schedule"))

    # the verbs

    def has_pause_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Whether the user may pause and resume schedules."""
        return bool(request.user.has_perm("pgbus_workflows.pause_workflowschedule"))

    def has_fire_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Whether the user may fire schedules by hand."""
        return bool(request.user.has_perm("pgbus_workflows.fire_workflowschedule"))

    def may_operate(self, request: HttpRequest, verb: str, schedule: WorkflowSchedule | None = None) -> bool:
        """The verb's permission, and the view permission (the buttons and the forms ask this).

        Fire now on a ``cancel_previous`` schedule cancels its ongoing runs: it needs
        :data:`CANCEL_PERMISSION` too.
        """
        permission = SCHEDULE_OPERATIONS[verb][0]
        allowed = getattr(self, f"has_{permission}_permission")(request, schedule)
        if verb == "fire_now" and cancels(schedule):
            allowed = allowed and request.user.has_perm(CANCEL_PERMISSION)
        return bool(allowed) and self.has_view_permission(request, schedule)

    def get_urls(self) -> list[URLPattern]:
        """One URL per schedule verb, then Django's own."""
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        urls = [
            path(f"<path:object_id>/{verb}/", wrap(partial(self.operation_view, verb=verb)), name=f"{prefix}_{verb}")
            for verb in SCHEDULE_OPERATIONS
        ]
        return urls + super().get_urls()

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The schedule's page, with its audit trail and the buttons of the verbs the user may take."""
        schedule = self.get_object(request, unquote(object_id))
        if schedule is not None and self.has_view_permission(request, schedule):
            buttons = [
                (verb, SCHEDULE_OPERATIONS[verb][1], self._verb_url(schedule, verb))
                for verb in SCHEDULE_OPERATIONS
                if verb in verbs.verbs(schedule) and self.may_operate(request, verb, schedule)
            ]
            extra_context = {
                "operation_buttons": buttons,
                "schedule_events": list(schedule.events.select_related("run").order_by("-pk")[:EVENTS_SHOWN]),
                **(extra_context or {}),
            }
        return super().change_view(request, object_id, form_url, extra_context)

    def _verb_url(self, schedule: WorkflowSchedule, verb: str) -> str:
        return reverse(f"{self.admin_site.name}:pgbus_workflows_workflowschedule_{verb}", args=[schedule.pk])

    def operation_view(self, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
        """A schedule page's button: a reason, then the verb (403 without its permission)."""
        schedule = self.get_object(request, unquote(object_id))
        if not self.may_operate(request, verb, schedule):
            raise PermissionDenied
        site = self.admin_site.name
        if schedule is None:
            self.message_user(request, _("There is no such schedule. Perhaps it was deleted?"), messages.WARNING)
            return HttpResponseRedirect(changelist_url(site, "workflowschedule"))
        back = change_url(site, "workflowschedule", schedule.pk)
        form = ScheduleReasonForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            actor, reason = request.user.get_username(), form.cleaned_data["reason"]
            try:
                result = getattr(verbs, verb)(schedule.pk, actor=actor, reason=reason)
            except WorkflowError as error:
                self.message_user(request, str(error), messages.WARNING)
                return HttpResponseRedirect(back)
            done = SCHEDULE_OPERATIONS[verb][2]
            if verb == "fire_now":
                run_url = change_url(site, "workflowrun", result.record.pk)
                self.message_user(
                    request, format_html('{}: {} <a href="{}">{}</a>.', schedule, done, run_url, _("run"))
                )
            else:
                self.message_user(request, f"{schedule}: {done}.", messages.SUCCESS)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "media": self.media,
            "title": SCHEDULE_OPERATIONS[verb][1],
            "subtitle": str(schedule),
            "opts": self.opts,
            "original": schedule,
            "form": form,
            "label": SCHEDULE_OPERATIONS[verb][1],
            "back_url": back,
        }
        request.current_app = site
        return TemplateResponse(request, "admin/pgbus_workflows/workflowschedule/operation.html", context)


def cancels(schedule: WorkflowSchedule | None) -> bool:
    """Whether firing ``schedule`` by hand may cancel runs (its overlap is ``cancel_previous``)."""
    return schedule is not None and schedule.overlap == "cancel_previous"
