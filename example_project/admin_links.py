"""A link from a model's admin page to the workflow runs about it (the operator console)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.db.models import Model
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html


def workflow_runs_link(obj: Model) -> str:
    """An HTML link to the admin list of the runs whose subject is ``obj``."""
    if obj.pk is None:
        return "-"
    try:
        url = reverse("admin:pgbus_workflows_workflowrun_changelist")
    except NoReverseMatch:  # the workflow admin is not installed
        return "-"
    query = urlencode({"subject_type": obj._meta.label_lower, "subject_id": str(obj.pk)})
    return format_html('<a href="{}?{}">workflow runs</a>', url, query)
