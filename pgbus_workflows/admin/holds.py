"""Holds in the admin: the dashboard's list with its release buttons and hold form, and the runs list's banner.

The dashboard shows every hold in force ("held since ... by ...: reason"); who has the
``hold_workflowrun`` permission sees a release button on each and a form to hold a class or a
queue, both posting to :func:`hold_view`, which calls ``services.holding`` with the user's
username as the actor. A class's runs list says when that class is held.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.utils.translation import gettext as _

from ..dsl.declared import NotRegistered
from ..models import HoldKind, WorkflowHold
from ..services import holding
from .forms import MAX_REASON_LENGTH

#: The permission that holds and releases (``app_label.codename``).
HOLD_PERMISSION = "pgbus_workflows.hold_workflowrun"


def holds_context(request: HttpRequest) -> dict[str, Any]:
    """The holds in force, and whether the user may hold and release."""
    return {
        "holds": holding.active_holds(),
        "may_hold": request.user.has_perm(HOLD_PERMISSION),
        "hold_kinds": HoldKind.choices,
    }


def class_hold(workflow_class: str | None) -> WorkflowHold | None:
    """The hold in force on ``workflow_class`` (the runs list's banner), or None."""
    if not workflow_class:
        return None
    return WorkflowHold.objects.active().filter(kind=HoldKind.CLASS, name=workflow_class).first()


def hold_view(modeladmin: Any, request: HttpRequest, back: str) -> HttpResponse:
    """POST ``action`` (hold or release), ``kind``, ``name`` and ``reason``; back to ``back`` with a message."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not request.user.has_perm(HOLD_PERMISSION):
        raise PermissionDenied
    action, kind, name = request.POST.get("action"), request.POST.get("kind"), request.POST.get("name", "").strip()
    reason = request.POST.get("reason", "").strip()[:MAX_REASON_LENGTH] or None
    actor = request.user.get_username()
    try:
        if kind not in HoldKind.values or action not in ("hold", "release"):
            raise ValueError(_("Choose hold or release, and a class or a queue."))
        if action == "hold":
            hold = (holding.hold_class if kind == HoldKind.CLASS else holding.hold_queue)(name, actor, reason)
            modeladmin.message_user(request, _("%(kind)s %(name)s held.") % {"kind": hold.kind, "name": hold.name})
        elif (holding.release_class if kind == HoldKind.CLASS else holding.release_queue)(name, actor, reason):
            modeladmin.message_user(request, _("%(kind)s %(name)s released.") % {"kind": kind, "name": name})
        else:
            modeladmin.message_user(request, _("%(kind)s %(name)s was not held.") % {"kind": kind, "name": name})
    except (NotRegistered, ValueError) as error:
        modeladmin.message_user(request, str(error), messages.WARNING)
    return HttpResponseRedirect(back)
