"""A run's admin page below its fields: buttons, the limiters its active step is under, the
timeline of attempts (drawn and listed), the audit events and the signals, each section paged.

A webhook can deliver thousands of signals and a long run makes hundreds of attempts, so the
page never loads all of a run's rows: each section shows ``PAGE_ROWS`` rows, newest first
(``?steps_page=``, ``?events_page=``, ``?signals_page=`` page back in time), its count taken
within the run through the run's index. The page sends the same queries whatever the run's
size: one for the counts, one per section, one for the active attempt and one, grouped, for
the fan-out progress of the attempts shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote
from django.db.models import Count, IntegerField, Model, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.translation import gettext as _

from ..models import FanOutJob, WorkflowEvent, WorkflowLimiter, WorkflowRun, WorkflowSignal, WorkflowStep
from ..services.children import CHILD_PREFIX
from ..services.forking import COPIED_FROM
from ..services.limiting import describe, held_back, undeclared
from ..sql import clock
from ..states import ACTIVE_STEP, ONGOING_RUN, JobStatus
from .display import change_url, changelist_url, format_duration, pretty_json, status_badge
from .limiters import run_limiters
from .operations import OPERATIONS, OperatedAdmin, allowed_verbs, may_view
from .records import event_shown
from .run_chart import timeline_chart

#: Rows shown per section of the run page.
PAGE_ROWS = 25

#: Seconds between two refreshes of an ongoing run's page (``static/pgbus_workflows/run_page.js``).
REFRESH_SECONDS = 5


@dataclass(frozen=True)
class Section:
    """One paged section of the run page: its rows' model, query parameter and anchor."""

    model: type[Model]
    param: str
    anchor: str
    noun: str


STEPS = Section(WorkflowStep, "steps_page", "timeline", "attempts")
EVENTS = Section(WorkflowEvent, "events_page", "events", "events")
SIGNALS = Section(WorkflowSignal, "signals_page", "signals", "signals")


def run_page_context(modeladmin: OperatedAdmin, request: HttpRequest, run: WorkflowRun) -> dict[str, Any]:
    """The run page below its fields: buttons, the paged timeline, events and signals.

    The attempts (their outputs and tracebacks), the events and the signals (their payloads)
    are shown only to users who may view those rows; None tells the template to leave them out.
    An event's error text (``records.event_shown``) only to users who may view the attempts.
    """
    site = modeladmin.admin_site
    now = clock.now()
    active = WorkflowStep.objects.filter(run_id=run.pk, status__in=sorted(ACTIVE_STEP)).order_by().first()
    allowed = allowed_verbs(run, active, now)
    buttons = [
        (op, reverse(f"{site.name}:pgbus_workflows_workflowrun_{op.verb}", args=[quote(run.pk)]))
        for op in OPERATIONS.values()
        if op.verb in allowed and modeladmin.may_operate(request, op, run)
    ]
    shown = [section for section in (STEPS, EVENTS, SIGNALS) if may_view(site, request, section.model)]
    counts = section_counts(run, shown)
    context: dict[str, Any] = {"operation_buttons": buttons, "timeline": None, "events": None, "signals": None}
    holds = held_back(active, now) if active is not None else []
    context["held_back"] = {"step": active.step_name, "text": describe(holds)} if active and holds else None
    if active is not None and (stray := undeclared(active, run.workflow_class)):
        context["undeclared_limits"] = {"step": active.step_name, "names": ", ".join(stray)}
    if active is not None and active.limiters and may_view(site, request, WorkflowLimiter):
        context["limiters"] = {"step": active.step_name, "rows": run_limiters(site.name, active.limiters, now)}
    if STEPS in shown:
        pager = page_of(request, STEPS, counts[STEPS])
        page = run.steps.order_by("-pk")[pager["offset"] : pager["offset"] + PAGE_ROWS]
        steps, jobs = list(page), fan_out_progress(page)
        context["timeline"] = [_timeline_row(site.name, step, jobs, now) for step in steps]
        context["timeline_chart"] = timeline_chart(steps, now, run.status in ONGOING_RUN)
        context["steps_pager"] = _shown(pager, len(steps))
    if EVENTS in shown:
        pager = page_of(request, EVENTS, counts[EVENTS])
        events = run.events.order_by("-pk")[pager["offset"] : pager["offset"] + PAGE_ROWS]
        errors = STEPS in shown
        context["events"] = [
            (e, change_url(site.name, "workflowevent", e.pk), reason, pretty_json(details))
            for e in events
            for reason, details in [event_shown(e, errors)]
        ]
        context["events_pager"] = _shown(pager, len(context["events"]))
    if SIGNALS in shown:
        pager = page_of(request, SIGNALS, counts[SIGNALS])
        signals = run.signals.order_by("-pk")[pager["offset"] : pager["offset"] + PAGE_ROWS]
        context["signals"] = [
            (s, change_url(site.name, "workflowsignal", s.pk), status_badge(s.status), pretty_json(s.payload))
            for s in signals
        ]
        context["signals_pager"] = _shown(pager, len(context["signals"]))
    context["family"] = family(site.name, run) if may_view(site, request, WorkflowRun) else None
    return {
        **context,
        "refresh_seconds": REFRESH_SECONDS if run.status in ONGOING_RUN else None,
        "steps_url": changelist_url(site.name, "workflowstep", run__id__exact=run.pk),
        "events_url": changelist_url(site.name, "workflowevent", run__id__exact=run.pk),
        "signals_url": changelist_url(site.name, "workflowsignal", run__id__exact=run.pk),
    }


def family(site_name: str, run: WorkflowRun) -> dict[str, Any] | None:
    """The run's parent and its first ``PAGE_ROWS`` children with their statuses (None: neither).

    Children are counted by status and listed in the order they were started, through the
    index of child runs; the rest are one link away (the runs list, filtered by parent).
    """
    parent = WorkflowRun.objects.filter(pk=run.parent_id).first() if run.parent_id is not None else None
    counts = WorkflowRun.objects.filter(parent_id=run.pk).count_by_status()
    if parent is None and not counts:
        return None
    children = list(WorkflowRun.objects.filter(parent_id=run.pk).order_by("pk")[:PAGE_ROWS]) if counts else []
    total = sum(counts.values())
    return {
        "parent": None if parent is None else (parent, change_url(site_name, "workflowrun", parent.pk)),
        "parent_badge": None if parent is None else status_badge(parent.status),
        "children": [
            (child, change_url(site_name, "workflowrun", child.pk), status_badge(child.status)) for child in children
        ],
        "counts": [(status_badge(status), n) for status, n in sorted(counts.items())],
        "total": total,
        "more": total - len(children),
        "children_url": changelist_url(site_name, "workflowrun", parent__id__exact=run.pk),
    }


def section_counts(run: WorkflowRun, sections: list[Section]) -> dict[Section, int]:
    """How many rows each section has for ``run``, in one query (each count within the run's index)."""
    if not sections:
        return {}
    annotations = {
        f"{section.anchor}_count": Coalesce(
            Subquery(
                section.model._default_manager.filter(run_id=OuterRef("pk"))
                .order_by()
                .values("run_id")
                .annotate(n=Count("pk"))
                .values("n"),
                output_field=IntegerField(),
            ),
            Value(0),
        )
        for section in sections
    }
    row = WorkflowRun.objects.filter(pk=run.pk).annotate(**annotations).values(*annotations).get()
    return {section: row[f"{section.anchor}_count"] for section in sections}


def page_of(request: HttpRequest, section: Section, count: int) -> dict[str, Any]:
    """The page of ``section`` the request asks for (1, the newest, by default), with its links.

    A page that is not a number, or is past the last page, shows the nearest page with a
    warning saying so.
    """
    pages = max(1, -(-count // PAGE_ROWS))
    raw = request.GET.get(section.param, "1")
    try:
        number = int(raw)
    except ValueError:
        number = 0
    if not 1 <= number <= pages:
        fallback = 1 if number < 1 else pages
        message = _("There is no page “%(page)s” of %(noun)s: page %(shown)d of %(pages)d is shown.") % {
            "page": raw,
            "noun": section.noun,
            "shown": fallback,
            "pages": pages,
        }
        messages.warning(request, message)
        number = fallback

    def link(target: int) -> str | None:
        if not 1 <= target <= pages:
            return None
        params = request.GET.copy()
        if target > 1:
            params[section.param] = str(target)
        else:
            params.pop(section.param, None)
        return f"?{params.urlencode()}#{section.anchor}"

    return {
        "number": number,
        "pages": pages,
        "count": count,
        "offset": (number - 1) * PAGE_ROWS,
        "newer_url": link(number - 1),
        "older_url": link(number + 1),
        "param": section.param,
    }


def _shown(pager: dict[str, Any], rows: int) -> dict[str, Any]:
    """The pager with the positions of its first and last row, newest being 1."""
    return {**pager, "first": pager["offset"] + 1 if rows else 0, "last": pager["offset"] + rows}


def fan_out_progress(page: QuerySet[WorkflowStep]) -> dict[int, dict[str, int]]:
    """``{step id: {"succeeded", "failed", "cancelled", "pending", "children": n}}`` for the fan-outs of ``page``.

    ``children``: how many of its members are child runs (a fan-out has jobs or children).

    One grouped query whatever the number of attempts: ``page`` (a sliced queryset) is its
    subquery, so it is sent even for a page without fan-out, and costs the same.
    """
    rows = (
        FanOutJob.objects.filter(step_id__in=page.values("pk"))
        .values_list("step_id", "status")
        .annotate(n=Count("pk"), children=Count("pk", filter=Q(function__startswith=CHILD_PREFIX)))
        .order_by()
    )
    progress: dict[int, dict[str, int]] = {}
    for step_id, status, n, children in rows:
        counts = progress.setdefault(
            step_id, {"succeeded": 0, "failed": 0, "cancelled": 0, "pending": 0, "children": 0}
        )
        key = "pending" if status in (JobStatus.PENDING, JobStatus.RUNNING) else status
        counts[key] += n
        counts["children"] += children
    return progress


def _timeline_row(site_name: str, step: WorkflowStep, jobs: dict[int, dict[str, int]], now: datetime) -> dict[str, Any]:
    if step.started_at is None:
        duration = ""
    elif step.finished_at is None:
        duration = _("%(duration)s so far") % {"duration": format_duration(max(now - step.started_at, timedelta(0)))}
    else:
        duration = format_duration(step.finished_at - step.started_at)
    fan_out = None
    if step.fan_out_total is not None:
        done = jobs.get(step.pk, {"succeeded": 0, "failed": 0, "cancelled": 0, "pending": 0, "children": 0})
        url = changelist_url(site_name, "fanoutjob", step__id__exact=step.pk)
        fan_out = {**done, "total": step.fan_out_total, "url": url}
    return {
        "step": step,
        "url": change_url(site_name, "workflowstep", step.pk),
        "status": status_badge(step.status, step.get_status_display()),
        "duration": duration,
        "output": None if step.output is None else pretty_json(step.output),
        "fan_out": fan_out,
        "copied_from": _copied_from(site_name, step),
    }


def _copied_from(site_name: str, step: WorkflowStep) -> dict[str, str] | None:
    """A fork's copy of an attempt: the run it was copied from, linked while that run is stored (else None)."""
    if not step.claimed_by.startswith(COPIED_FROM):
        return None
    workflow_id = step.claimed_by.removeprefix(COPIED_FROM)
    original = WorkflowRun.objects.filter(workflow_id=workflow_id).only("pk").first()
    url = change_url(site_name, "workflowrun", original.pk) if original is not None else ""
    return {"workflow_id": workflow_id, "url": url}
