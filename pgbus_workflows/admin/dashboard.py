"""The dashboard: runs by class, status and stuck reason, the dispatchers, the last hour's attempts.

``dashboard_context()`` builds the page's figures from the gauge (``services.stuck.gauge``),
read through indexes only; ``bar_chart()`` lays out its charts so the template only draws them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db.models import Count
from django.http import HttpRequest
from django.urls import reverse

from .. import sql
from ..conf import settings
from ..models import Dispatcher, WorkflowRun, WorkflowStep
from ..services.rollups import window_cells
from ..services.stuck import GAUGE_EXACT_UP_TO, STUCK_REASONS, gauge
from ..sql.counting import bounded_count
from ..states import ONGOING_RUN, RunStatus, StepStatus
from .display import changelist_url, format_duration, status_badge
from .operations import may_view
from .paging import count_label

if TYPE_CHECKING:
    from django.contrib.admin import AdminSite

CHART_LABEL_WIDTH = 190
CHART_BAR_WIDTH = 520
CHART_BAR_HEIGHT = 20
CHART_ROW_HEIGHT = 28


def bar_chart(rows: list[dict[str, Any]], key: str, label: str = "workflow_class") -> dict[str, Any]:
    """Horizontal stacked bars, one per row (a class, or a step) with a total, laid out for the template to draw."""
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
        bars.append({"label": row[label], "y": index * CHART_ROW_HEIGHT, "segments": segments, **row})
        bars[-1]["end"] = round(x + 6, 1)
    return {
        "bars": bars,
        "height": max(len(rows), 1) * CHART_ROW_HEIGHT,
        "width": CHART_LABEL_WIDTH + CHART_BAR_WIDTH + 60,
        "bar_height": CHART_BAR_HEIGHT,
        "label_x": CHART_LABEL_WIDTH - 8,
    }


def dashboard_context(site: AdminSite, request: HttpRequest, now: datetime) -> dict[str, Any]:
    """Runs by class and status and by stuck reason (``services.stuck.gauge``), dispatchers, last hour's steps.

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
        entry["insights_url"] = reverse(f"{site.name}:pgbus_workflows_insights", args=[entry["workflow_class"]])
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
        "held_back": data["held_back"],  # every step under a limit, by class and step
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
    """Every dispatcher with the age of its heartbeat, and whether it is alive."""
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
    """Attempts completed and failed in the last hour, by class, each linked to the steps list.

    On PostgreSQL read as insights read step performance (``services.rollups.window_cells``: the
    rolled-up hours and spans, and the attempts at the window's edges), so the cost does not grow
    with the hour's volume.
    """
    kinds = (StepStatus.COMPLETED, StepStatus.FAILED)
    counts: dict[tuple[str, str], int] = {}
    if sql.postgresql():
        for (klass, _step), cell in window_cells(None, now - timedelta(hours=1), now).items():
            for status in kinds:
                if n := getattr(cell, str(status)):
                    counts[(klass, status)] = counts.get((klass, status), 0) + n
    else:
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
