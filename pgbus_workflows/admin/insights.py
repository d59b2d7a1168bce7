"""The insights page of one workflow class: its pipeline, its steps' performance, its funnel.

At ``<admin>/pgbus_workflows/workflowrun/insights/<class name>/`` (URL name
``admin:pgbus_workflows_insights``), linked from the dashboard and from the run list filtered
by class. The figures are ``services.insights.class_insights``'s; this module lays out their
charts (``dashboard.bar_chart``) and links every count to the runs or attempts it counts.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.http import Http404, HttpRequest
from django.utils.translation import gettext_lazy as _

from ..services.insights import DEFAULT_WINDOW, ENDINGS, HELD_BACK, PIPELINE_COLUMNS, WINDOWS, class_insights
from ..states import RunStatus, StepStatus
from .dashboard import bar_chart
from .display import changelist_url, format_duration, status_badge

if TYPE_CHECKING:
    from django.contrib.admin import AdminSite


def insights_context(site: AdminSite, request: HttpRequest, workflow_class: str, now: datetime) -> dict[str, Any]:
    """The page's figures and charts for ``?window=`` (default 24h); 404 for a class with no code and no runs."""
    window = request.GET.get("window", DEFAULT_WINDOW)
    if window not in WINDOWS:
        window = DEFAULT_WINDOW
    try:
        data = class_insights(workflow_class, WINDOWS[window], now)
    except LookupError as error:
        raise Http404(str(error)) from None
    runs = partial(changelist_url, site.name, "workflowrun", workflow_class=workflow_class)
    steps = partial(changelist_url, site.name, "workflowstep", workflow_class=workflow_class)
    pipeline = [
        {
            "step": row["step"],
            "total": row["total"],
            "statuses": [
                # held back: the ready runs of the step, which the run list shows (and each run page says why)
                {"key": s, "count": row["counts"][s], "url": runs(status=_listed(s), current_step=row["step"])}
                for s in PIPELINE_COLUMNS
            ],
        }
        for row in data["pipeline"]
    ]
    performance = [
        {
            **row,
            "p50": _seconds(row["p50_seconds"]),
            "p95": _seconds(row["p95_seconds"]),
            "total": row["attempts"],
            "url": steps(step_name=row["step"], finished_within=window),
            "endings": [
                {
                    "key": str(s),
                    "count": row[str(s)],
                    "url": steps(step_name=row["step"], status__exact=s, finished_within=window),
                }
                for s in ENDINGS
            ],
        }
        for row in data["performance"]
    ]
    funnel = data["funnel"]
    reached = [
        {
            **row,
            "total": row["reached"],
            "share": _percent(row["reached_rate"]),
            "cells": [{"key": str(StepStatus.COMPLETED), "count": row["reached"], "url": runs()}],
            "here": [
                {
                    "key": status,
                    "count": n,
                    "url": runs(status=status, current_step=row["step"]),
                    "badge": status_badge(status, RunStatus(status).label),
                }
                for status, n in sorted(row["here"].items())
            ],
        }
        for row in funnel["steps"]
    ]
    return {
        "workflow_class": workflow_class,
        "insights": data,
        "window": window,
        "windows": [(label, label == window) for label in WINDOWS],
        "since": datetime.fromisoformat(data["since"]),
        "pipeline_statuses": [_pipeline_badge(s) for s in PIPELINE_COLUMNS],
        "pipeline": pipeline,
        "pipeline_chart": bar_chart(pipeline, "statuses", label="step"),
        "endings": [status_badge(s, s.label) for s in ENDINGS],
        "performance": performance,
        "performance_chart": bar_chart(performance, "endings", label="step"),
        "funnel": {**funnel, "steps": reached},
        "funnel_chart": bar_chart(reached, "cells", label="step"),
        "finished_badge": status_badge(RunStatus.FINISHED, RunStatus.FINISHED.label),
        "runs_url": runs(),
        "now": now,
    }


def _listed(column: str) -> str:
    return str(RunStatus.READY) if column == HELD_BACK else column


def _pipeline_badge(column: str) -> Any:
    return status_badge(column, _("Held back") if column == HELD_BACK else RunStatus(column).label)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else format_duration(timedelta(seconds=value))


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.0f}%"
