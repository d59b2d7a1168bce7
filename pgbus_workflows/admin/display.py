"""How the operator console shows things: links to its pages, JSON, status badges, durations.

Shared by every page of the console (the lists, the run page, the dashboard, the schedules);
it imports nothing else of the admin, so every other module of it may import it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib.admin.utils import quote
from django.core.serializers.json import DjangoJSONEncoder
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from ..models import WorkflowRun

if TYPE_CHECKING:
    from django.contrib.admin import AdminSite


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
