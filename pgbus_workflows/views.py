"""The view a project routes itself: the health check that a load balancer or an uptime monitor calls.

::

    # urls.py
    import pgbus_workflows.views

    urlpatterns = [..., path("workflows/health/", pgbus_workflows.views.health_view)]
"""

from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_safe

from .services.health import check_health


@require_safe
def health_view(request: HttpRequest) -> JsonResponse:
    """``{"healthy", "reasons", "checked_at"}``: status 200 when healthy, 503 when not (GET or HEAD).

    It needs no login, so it shows the verdict and its reasons only: no dispatcher names, hosts
    or figures (``manage.py workflows health`` and MCP's ``health`` tool show those). A
    database it cannot read is a 503 whose reason says so.
    """
    try:
        health = check_health()
    except DatabaseError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return JsonResponse({"healthy": False, "reasons": [f"cannot use the database: {first}"]}, status=503)
    body = {"healthy": health.healthy, "reasons": health.reasons, "checked_at": health.checked_at.isoformat()}
    return JsonResponse(body, status=200 if health.healthy else 503)
