"""What the operator console does and shows, apart from the ModelAdmin declarations.

- ``operation_view()``: the form behind a button on the run page; ``bulk_operation()``: a
  changelist action with its confirmation page. Both call the public verbs (through
  ``admin_forms.perform``) with ``actor`` = the admin user's username.
- ``may_view()`` and the formatting helpers the run page (``admin_run_page``) shares.
- ``dashboard_context()``: runs by class, status and stuck reason, dispatchers, last hour.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Count, Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ..conf import settings
from ..exceptions import WorkflowError
from ..models import Dispatcher, WorkflowRun, WorkflowStep
from ..services.stuck import GAUGE_EXACT_UP_TO, STUCK_REASONS, gauge
from ..sql.counting import bounded_count, estimated_count
from ..states import ONGOING_RUN, RunStatus, StepStatus
from .forms import ReasonForm
from .operations import OPERATIONS, Operation, perform
from .paging import count_label

if TYPE_CHECKING:
    from django.contrib.admin import AdminSite

    from .runs import WorkflowRunAdmin


def change_url(site_name: str, model_name: str, pk: Any) -> str:
    """The admin page of one of this app's rows."""
    return reverse(f"{site_name}:pgbus_workflows_{model_name}_change", args=[quote(pk)])


def run_url(site_name: str, run: WorkflowRun) -> str:
    """The admin page of a run."""
    return change_url(site_name, "workflowrun", run.pk)


def changelist_url(site_name: str, model_name: str, **params: Any) -> str:
    """An admin changelist of this app, filtered by ``params``."""
    url = reverse(f"{site_name}:pgbus_workflows_{model_name}_changelist")
    return f"{url}?{urlencode(params)}" if params else url


def subject_link(site: AdminSite, subject_type: str | None, subject_id: str | None) -> str:
    """The subject as "order 42", linked to its admin page when its model is registered there.

    Nothing is loaded: the label comes from the model's name and the stored id, so a
    changelist page costs no query per row.
    """
    if not subject_type or subject_id is None:
        return "-"
    try:
        model = apps.get_model(subject_type)
    except (LookupError, ValueError):
        return f"{subject_type} {subject_id}"
    label = f"{model._meta.verbose_name} {subject_id}"
    if not site.is_registered(model):
        return label
    try:
        url = reverse(f"{site.name}:{model._meta.app_label}_{model._meta.model_name}_change", args=[quote(subject_id)])
    except NoReverseMatch:
        return label
    return format_html('<a href="{}">{}</a>', url, label)


def pretty_json(value: Any) -> str:
    """JSON indented for a ``<pre>`` block."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)


def status_badge(status: str, label: Any = None) -> SafeString:
    """A coloured status label (colours in ``static/pgbus_workflows/admin.css``)."""
    return format_html('<span class="pgbus-badge pgbus-s-{}">{}</span>', status, label or status)


def format_duration(duration: timedelta | None) -> str:
    """``1.2 s``, ``3 min 4 s``, ``2 h 5 min``: short enough for a table cell."""
    if duration is None:
        return ""
    seconds = duration.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


# -- the operations ------------------------------------------------------------------------------


def _report(op: Operation, done: int, refused: Counter[str]) -> str:
    """The message of a bulk action: "3 paused; 1 unchanged: <why>", one part per reason."""
    parts = [_("%(count)d %(done)s") % {"count": done, "done": op.done}]
    parts += [_("%(count)d unchanged: %(reason)s") % {"count": n, "reason": why} for why, n in refused.items()]
    return "; ".join(parts)


def bulk_operation(
    modeladmin: WorkflowRunAdmin, request: HttpRequest, queryset: QuerySet[WorkflowRun], verb: str
) -> HttpResponse | None:
    """A changelist action: ask for a reason, then apply the verb to each selected run."""
    op = OPERATIONS[verb]
    if not modeladmin.may_operate(request, op):  # the changelist checks too; this keeps the action safe alone
        raise PermissionDenied
    form = ReasonForm(request.POST if "post" in request.POST else None)
    if form.is_valid():
        done, refused = 0, Counter[str]()
        actor = request.user.get_username()
        for run in queryset.order_by("pk").iterator():
            if not modeladmin.may_operate(request, op, run):
                refused[_("you may not %(verb)s it") % {"verb": op.verb.replace("_", " ")}] += 1
                continue
            try:
                perform(op, run.pk, form.cleaned_data, actor)
            except WorkflowRun.DoesNotExist:
                refused[_("it no longer exists")] += 1
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
        "title": _("%(label)s: are you sure?") % {"label": op.label},
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


def operation_view(modeladmin: WorkflowRunAdmin, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
    """The form behind a run page's button: GET shows it, POST calls the verb and goes back."""
    op = OPERATIONS[verb]
    if not modeladmin.has_view_permission(request):
        raise PermissionDenied
    run = modeladmin.get_object(request, object_id)
    if run is not None and not modeladmin.may_operate(request, op, run):
        raise PermissionDenied  # the verb's permission, and the view permission on this very run
    if run is None:
        message = _("There is no workflow run with ID “%(key)s”. Perhaps it was deleted?") % {"key": object_id}
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
            message = _("A signal with this idempotency key was already delivered: nothing changed.")
            modeladmin.message_user(request, message, messages.WARNING)
        elif op.verb == "rerun":
            message = _("Rerun started as run %(id)s.") % {"id": result.workflow_id}
            modeladmin.message_user(request, message, messages.SUCCESS)
            return HttpResponseRedirect(run_url(site, result))
        elif op.verb == "signal":
            message = _("Signal “%(name)s” delivered to run %(run)s.") % {"name": result.name, "run": run.workflow_id}
            modeladmin.message_user(request, message, messages.SUCCESS)
        else:
            message = _("Run %(run)s: %(done)s.") % {"run": run.workflow_id, "done": op.done}
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


# -- shared with the run page --------------------------------------------------------------------


def may_view(site: AdminSite, request: HttpRequest, model: type[Model]) -> bool:
    """Whether the user may see ``model``'s rows, as its registered ``ModelAdmin`` says."""
    try:
        return bool(site.get_model_admin(model).has_view_permission(request))
    except NotRegistered:
        return False


# -- the dashboard ---------------------------------------------------------------------------------

CHART_LABEL_WIDTH = 190
CHART_BAR_WIDTH = 520
CHART_BAR_HEIGHT = 20
CHART_ROW_HEIGHT = 28


def bar_chart(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Horizontal stacked bars, one per class with runs, laid out here so the template only draws them."""
    rows = [row for row in rows if row["total"]]
    largest = max((row["total"] for row in rows), default=0) or 1
    bars = []
    for index, row in enumerate(rows):
        x, segments = float(CHART_LABEL_WIDTH), []
        for cell in row[key]:
            width = CHART_BAR_WIDTH * cell["count"] / largest
            if width:
                segments.append({**cell, "x": round(x, 1), "width": round(width, 1)})
            x += width
        bars.append({"label": row["workflow_class"], "y": index * CHART_ROW_HEIGHT, "segments": segments, **row})
        bars[-1]["end"] = round(x + 6, 1)
    return {
        "bars": bars,
        "height": max(len(rows), 1) * CHART_ROW_HEIGHT,
        "width": CHART_LABEL_WIDTH + CHART_BAR_WIDTH + 60,
        "bar_height": CHART_BAR_HEIGHT,
        "label_x": CHART_LABEL_WIDTH - 8,
    }


def dashboard_context(site: AdminSite, request: HttpRequest, now: datetime) -> dict[str, Any]:
    """Runs by class and status and by stuck reason (``sweep.gauge``), dispatchers, last hour's steps.

    The dispatchers (hosts and PIDs) only for users who may view them.
    """
    data = gauge(now)
    runs = partial(changelist_url, site.name, "workflowrun")
    by_class: dict[str, dict[str, Any]] = {}
    for row in data["statuses"]:
        klass = row["workflow_class"]
        entry = by_class.setdefault(klass, {"workflow_class": klass, "statuses": [], "stuck": [], "total": 0})
        url = runs(workflow_class=klass, status=row["status"])
        estimated = row["count"] > GAUGE_EXACT_UP_TO  # the gauge's estimate, said as "about N"
        shown = count_label(row["count"], estimated, GAUGE_EXACT_UP_TO)
        entry["statuses"].append(
            {"key": row["status"], "count": row["count"], "url": url, "estimated": estimated, "shown": shown}
        )
        entry["total"] += row["count"]
    for row in data["stuck"]:
        entry = by_class[row["workflow_class"]]
        url = runs(workflow_class=row["workflow_class"], stuck=row["reason"])
        entry["stuck"].append({"key": row["reason"], "count": row["count"], "url": url})
    rows = list(by_class.values())
    for entry in rows:
        entry["stuck_total"] = sum(cell["count"] for cell in entry["stuck"])
        entry["url"] = runs(workflow_class=entry["workflow_class"])
    totals = [
        {
            "key": s,
            "count": sum(r["statuses"][i]["count"] for r in rows),
            "url": runs(status=s),
            "estimated": any(r["statuses"][i]["estimated"] for r in rows),
        }
        for i, s in enumerate(RunStatus.values)
    ]
    for cell in totals:  # a sum with an estimate in it is an estimate too
        cell["shown"] = count_label(cell["count"], cell["estimated"], GAUGE_EXACT_UP_TO)
    for entry in rows:
        entry["shown"] = count_label(entry["total"], any(c["estimated"] for c in entry["statuses"]), GAUGE_EXACT_UP_TO)
    grand = sum(cell["count"] for cell in totals)
    grand_estimated = any(cell["estimated"] for cell in totals)
    grand_total = {"count": grand, "url": runs(), "shown": count_label(grand, grand_estimated, GAUGE_EXACT_UP_TO)}
    stuck_totals = [
        {"key": s, "count": sum(r["stuck"][i]["count"] for r in rows), "url": runs(stuck=s)}
        for i, s in enumerate(STUCK_REASONS)
    ]
    return {
        "statuses": [(s, status_badge(s, label)) for s, label in RunStatus.choices],
        "stuck_reasons": [(r, status_badge(r, r.replace("_", " "))) for r in STUCK_REASONS],
        "rows": rows,
        "totals": totals,
        "grand_total": grand_total,
        "stuck_totals": stuck_totals,
        "all_runs_url": runs(),
        "status_chart": bar_chart(rows, "statuses"),
        "stuck_chart": bar_chart([{**r, "total": r["stuck_total"]} for r in rows], "stuck"),
        "dispatchers": _dispatchers(now) if may_view(site, request, Dispatcher) else None,
        "recent_steps": _recent_steps(site, now),
        "children_of_paused": _children_of_paused(data["statuses"], runs(status=RunStatus.PAUSED)),
        "now": now,
    }


def _children_of_paused(statuses: list[dict[str, Any]], paused_url: str) -> dict[str, Any] | None:
    """Ongoing child runs whose parent is paused (pausing a parent does not pause its children).

    The paused parents through the (class, status) index, for the classes the gauge found
    paused runs of, then their children through the children's index; counted up to
    ``GAUGE_EXACT_UP_TO``. None when no run is paused.
    """
    classes = sorted({row["workflow_class"] for row in statuses if row["status"] == RunStatus.PAUSED and row["count"]})
    if not classes:
        return None
    parents = WorkflowRun.objects.filter(workflow_class__in=classes, status=RunStatus.PAUSED).values("pk")
    children = WorkflowRun.objects.filter(parent_id__in=parents, status__in=sorted(ONGOING_RUN))
    count = bounded_count(children, GAUGE_EXACT_UP_TO)
    return {"count": min(count, GAUGE_EXACT_UP_TO), "more": count > GAUGE_EXACT_UP_TO, "url": paused_url}


def _dispatchers(now: datetime) -> list[dict[str, Any]]:
    dead_after = settings.DISPATCHER_DEAD_AFTER
    return [
        {
            "dispatcher": d,
            "age": format_duration(max(now - d.heartbeat_at, timedelta(0))),
            "alive": now - d.heartbeat_at < dead_after,
        }
        for d in Dispatcher.objects.order_by("name")
    ]


def _recent_steps(site: AdminSite, now: datetime) -> dict[str, Any]:
    """Attempts completed and failed in the last hour, by class, each linked to the steps list."""
    kinds = (StepStatus.COMPLETED, StepStatus.FAILED)
    rows = (
        WorkflowStep.objects.filter(finished_at__gte=now - timedelta(hours=1), status__in=kinds)
        .values_list("run__workflow_class", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    counts = {(klass, status): n for klass, status, n in rows}
    steps = partial(changelist_url, site.name, "workflowstep", finished_within="1h")
    by_class = [
        {
            "workflow_class": klass,
            "cells": [
                {"key": s, "count": counts.get((klass, s), 0), "url": steps(workflow_class=klass, status__exact=s)}
                for s in kinds
            ],
        }
        for klass in sorted({klass for klass, _status in counts})
    ]
    totals = [
        {
            "key": s,
            "count": sum(n for (_klass, status), n in counts.items() if status == s),
            "url": steps(status__exact=s),
        }
        for s in kinds
    ]
    return {"kinds": [status_badge(s, s.label) for s in kinds], "rows": by_class, "totals": totals}
