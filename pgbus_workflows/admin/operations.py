"""The operations of the operator console: the verbs the admin offers, and who may take them.

``OPERATIONS`` lists every verb with its permission, labels and form. ``allowed_verbs()``
asks ``states.allowed_verbs`` which ones a run's state allows, for showing buttons only:
the verb itself decides, under the run's lock. ``perform()`` calls the same public verbs
user code calls (``services.operator``, ``services.signals``).

``OperatedAdmin`` carries the one permission path (``may_operate`` and the
``has_<verb>_permission`` methods): the menu, the buttons, the forms, the bulk actions and
the CLI all ask it. ``operation_view()`` is the form behind a run page's button;
``bulk_operation()`` a changelist action with its confirmation page; both call ``perform()``
with ``actor`` = the admin user's username.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.exceptions import NotRegistered
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import states
from ..exceptions import WorkflowError
from ..models import WorkflowRun, WorkflowStep
from ..services import forking, operator
from ..services.signals import deliver_signal
from ..sql.counting import estimated_count
from .display import changelist_url, run_url, status_badge
from .forms import ForkForm, ReasonForm, ResumeAtForm, SignalForm

if TYPE_CHECKING:
    from django.contrib.admin import AdminSite
    from django.utils.functional import _StrOrPromise


@dataclass(frozen=True)
class Operation:
    """One operator verb as the admin offers it."""

    verb: str  # the function in the services, and the last part of its URL
    permission: str  # "pause" -> has_pause_permission() and pgbus_workflows.pause_workflowrun
    label: _StrOrPromise  # the button
    done: _StrOrPromise  # "paused" in "3 paused"
    form_class: type[ReasonForm] = ReasonForm
    bulk_form_class: type[ReasonForm] = ReasonForm  # the changelist action's confirmation form


OPERATIONS: dict[str, Operation] = {
    op.verb: op
    for op in (
        Operation("pause", "pause", _("Pause"), _("paused")),
        Operation("resume", "pause", _("Resume"), _("resumed")),
        Operation("resume_at", "skip", _("Resume at a step"), _("resumed"), ResumeAtForm),
        Operation("run_now", "run_now", _("Run now"), _("made due now")),
        Operation("skip", "skip", _("Skip the current step"), _("moved past the current step")),
        Operation("signal", "signal", _("Deliver a signal"), _("signalled"), SignalForm),
        Operation("cancel", "cancel", _("Cancel"), _("cancelled")),
        Operation("rerun", "rerun", _("Rerun"), _("rerun")),
        # A fork starts a new run like a rerun does: the rerun permission governs both.
        Operation("fork", "rerun", _("Fork"), _("forked"), ForkForm, ForkForm),
    )
}


def allowed_verbs(run: WorkflowRun, active: WorkflowStep | None, now: datetime) -> frozenset[str]:
    """The verbs the run's state allows (``states.allowed_verbs``), for showing buttons only."""
    return states.allowed_verbs(operator.run_facts(run, active, now))


def perform(op: Operation, run_pk: int, data: dict[str, Any], actor: str) -> Any:
    """Call the public verb behind ``op``; raises what the verb raises, having changed nothing."""
    reason = data.get("reason") or None
    if op.verb == "resume_at":
        return operator.resume_at(run_pk, data["step"], actor=actor, reason=reason)
    if op.verb == "fork":
        return forking.fork(run_pk, data.get("from_step") or None, actor=actor, reason=reason)
    if op.verb == "signal":
        return deliver_signal(
            run_pk,
            data["name"],
            payload=data["payload"],
            idempotency_key=data["idempotency_key"],
            actor=actor,
            reason=reason,
        )
    return getattr(operator, op.verb)(run_pk, actor=actor, reason=reason)


# -- who may take them ---------------------------------------------------------------------------


class OperatedAdmin(admin.ModelAdmin):
    """A run admin's permission path: ``may_operate`` and one ``has_<permission>_permission`` per verb.

    The menu, the buttons, the forms, the bulk actions and the CLI (``operating.operators``)
    all ask ``may_operate``, so overriding one ``has_<x>_permission`` changes all of them.
    """

    def _has(self, request: HttpRequest, permission: str, obj: Model | None) -> bool:
        """The model permission, or (for object-level backends) the permission on ``obj``."""
        # The permissions are declared on WorkflowRun.Meta, whatever model this admin shows.
        codename = f"pgbus_workflows.{permission}_workflowrun"
        return request.user.has_perm(codename) or (obj is not None and request.user.has_perm(codename, obj))

    def has_pause_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Pause and resume."""
        return self._has(request, "pause", obj)

    def has_cancel_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Cancel."""
        return self._has(request, "cancel", obj)

    def has_rerun_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Rerun (a new run with the same arguments)."""
        return self._has(request, "rerun", obj)

    def has_run_now_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Make the scheduled step due now."""
        return self._has(request, "run_now", obj)

    def has_skip_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Skip the current step, and resume at a chosen step."""
        return self._has(request, "skip", obj)

    def has_signal_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Deliver a signal."""
        return self._has(request, "signal", obj)

    def may_operate(self, request: HttpRequest, op: Operation, run: WorkflowRun | None = None) -> bool:
        """Whether the user may run ``op`` (on ``run``): its ``has_<permission>_permission``, and,
        on a run, the view permission on it too. The menu, the buttons, the forms and the bulk
        actions all ask this, so overriding one ``has_<x>_permission`` changes all of them."""
        allowed = getattr(self, f"has_{op.permission}_permission")(request, run)
        return bool(allowed) and (run is None or self.has_view_permission(request, run))


def may_view(site: AdminSite, request: HttpRequest, model: type[Model]) -> bool:
    """Whether the user may see ``model``'s rows, as its registered ``ModelAdmin`` says."""
    try:
        return bool(site.get_model_admin(model).has_view_permission(request))
    except NotRegistered:
        return False


# -- the views -------------------------------------------------------------------------------------


def _report(op: Operation, done: int, refused: Counter[str]) -> str:
    """The message of a bulk action: "3 paused; 1 unchanged: <why>", one part per reason."""
    parts = [gettext("%(count)d %(done)s") % {"count": done, "done": op.done}]
    parts += [gettext("%(count)d unchanged: %(reason)s") % {"count": n, "reason": why} for why, n in refused.items()]
    return "; ".join(parts)


def bulk_operation(
    modeladmin: OperatedAdmin, request: HttpRequest, queryset: QuerySet[WorkflowRun], verb: str
) -> HttpResponse | None:
    """A changelist action: ask for a reason, then apply the verb to each selected run."""
    op = OPERATIONS[verb]
    if not modeladmin.may_operate(request, op):  # the changelist checks too; this keeps the action safe alone
        raise PermissionDenied
    form = op.bulk_form_class(request.POST if "post" in request.POST else None)
    if form.is_valid():
        done, refused = 0, Counter[str]()
        actor = request.user.get_username()
        for run in queryset.order_by("pk").iterator():
            if not modeladmin.may_operate(request, op, run):
                refused[gettext("you may not %(verb)s it") % {"verb": op.verb.replace("_", " ")}] += 1
                continue
            try:
                perform(op, run.pk, form.cleaned_data, actor)
            except WorkflowRun.DoesNotExist:
                refused[gettext("it no longer exists")] += 1
            except WorkflowError as error:
                refused[str(error)] += 1
            else:
                done += 1
        modeladmin.message_user(request, _report(op, done, refused), messages.WARNING if refused else messages.SUCCESS)
        return None
    shown = list(queryset.order_by("pk")[:50])
    selected, estimated = estimated_count(queryset.order_by("pk"))  # no COUNT(*) over a million selected runs
    context = {
        **modeladmin.admin_site.each_context(request),
        "media": modeladmin.media,
        "title": gettext("%(label)s: are you sure?") % {"label": op.label},
        "opts": modeladmin.opts,
        "operation": op,
        "form": form,
        "runs": [(run, run_url(modeladmin.admin_site.name, run)) for run in shown],
        "more": max(selected - len(shown), 0),
        "more_estimated": estimated,
        "action": f"{verb}_runs",
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across", "0"),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, "admin/pgbus_workflows/workflowrun/bulk_confirmation.html", context)


def operation_view(modeladmin: OperatedAdmin, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
    """The form behind a run page's button: GET shows it, POST calls the verb and goes back."""
    op = OPERATIONS[verb]
    if not modeladmin.has_view_permission(request):
        raise PermissionDenied
    run = modeladmin.get_object(request, object_id)
    if run is not None and not modeladmin.may_operate(request, op, run):
        raise PermissionDenied  # the verb's permission, and the view permission on this very run
    if run is None:
        message = gettext("There is no workflow run with ID “%(key)s”. Perhaps it was deleted?") % {"key": object_id}
        modeladmin.message_user(request, message, messages.WARNING)
        return HttpResponseRedirect(changelist_url(modeladmin.admin_site.name, "workflowrun"))
    site = modeladmin.admin_site.name
    form = op.form_class(request.POST if request.method == "POST" else None, run=run)
    if form.is_valid():
        try:
            result = perform(op, run.pk, form.cleaned_data, request.user.get_username())
        except WorkflowError as error:
            modeladmin.message_user(request, str(error), messages.WARNING)
            return HttpResponseRedirect(run_url(site, run))
        if getattr(result, "duplicate_delivery", False):
            message = gettext("A signal with this idempotency key was already delivered: nothing changed.")
            modeladmin.message_user(request, message, messages.WARNING)
        elif op.verb in ("rerun", "fork"):
            started = (
                gettext("Rerun started as run %(id)s.")
                if op.verb == "rerun"
                else gettext("Fork started as run %(id)s.")
            )
            message = started % {"id": result.workflow_id}
            modeladmin.message_user(request, message, messages.SUCCESS)
            return HttpResponseRedirect(run_url(site, result))
        elif op.verb == "signal":
            message = gettext("Signal “%(name)s” delivered to run %(run)s.") % {
                "name": result.name,
                "run": run.workflow_id,
            }
            modeladmin.message_user(request, message, messages.SUCCESS)
        else:
            message = gettext("Run %(run)s: %(done)s.") % {"run": run.workflow_id, "done": op.done}
            modeladmin.message_user(request, message, messages.SUCCESS)
        return HttpResponseRedirect(run_url(site, run))
    context = {
        **modeladmin.admin_site.each_context(request),
        "media": modeladmin.media,
        "title": op.label,
        "subtitle": str(run),
        "opts": modeladmin.opts,
        "original": run,
        "operation": op,
        "form": form,
        "run_url": run_url(site, run),
        "status": status_badge(run.status, run.get_status_display()),
    }
    request.current_app = site
    return TemplateResponse(request, "admin/pgbus_workflows/workflowrun/operation.html", context)
