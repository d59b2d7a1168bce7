"""Who acts from the terminal, whether they may, and the operator verbs they call.

Without ``--as-user`` the command runs as a system operator: whoever has a shell on the
server with the project's settings is trusted as ``manage.py shell`` is, so nothing is
checked, and the events record ``--actor`` (default ``cli:<os user>``).

With ``--as-user USERNAME`` the Django user is checked as the admin checks them: they must be
able to enter the admin (active and staff), and each run is asked of the registered
``WorkflowRunAdmin.may_operate(request, op, run)``: the verb's ``has_<permission>_permission``
and the view permission on that very run, object-level backends included. That is the
method the admin's buttons, forms and bulk actions ask, so a subclass that overrides one
governs the terminal too. The events record their username, as the admin does.

Verbs go through ``admin.operations.perform``: the same call, with the same data, as the admin's.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from typing import Any

from django.contrib.admin.sites import AdminSite, all_sites, site
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from ..admin.operations import OPERATIONS, Operation, allowed_verbs, may_view, perform
from ..admin.records import event_shown, paused_reason_shown
from ..admin.runs import WorkflowRunAdmin
from ..exceptions import WorkflowError
from ..models import WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from ..services.ledger import MAX_ACTOR_LENGTH
from ..services.limiting import held_back, undeclared
from ..sql import clock
from .runs import (
    RunNotFound,
    active_attempt,
    attempt_row,
    event_row,
    find_run,
    latest,
    pending_signals,
    run_details,
    signal_row,
)


def os_user() -> str:
    """The login name of the process (its uid when the system has no name for it)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no passwd entry (some containers)
        return str(os.getuid())


def run_admin() -> WorkflowRunAdmin:
    """The ``WorkflowRunAdmin`` the project registered (the default site first), else the app's own."""
    sites: list[AdminSite] = [site, *sorted((s for s in all_sites if s is not site), key=lambda s: s.name)]
    for candidate in sites:
        if candidate.is_registered(WorkflowRun):
            model_admin = candidate.get_model_admin(WorkflowRun)
            if isinstance(model_admin, WorkflowRunAdmin):
                return model_admin
    return WorkflowRunAdmin(WorkflowRun, site)


@dataclass
class Operator:
    """Who acts: a name for the audit trail, and (with ``--as-user``) the user whose permissions count."""

    actor: str
    user: Any = None
    model_admin: WorkflowRunAdmin | None = None
    request: HttpRequest = field(default_factory=HttpRequest)

    @classmethod
    def system(cls, actor: str | None) -> Operator:
        """The trusted shell: no permission is asked; ``actor`` (default ``cli:<os user>``) is recorded."""
        if actor is not None and not actor.strip():
            raise CommandError("--actor must not be empty")
        name = actor.strip() if actor is not None else f"cli:{os_user()}"
        if len(name) > MAX_ACTOR_LENGTH:
            raise CommandError(f"--actor must be at most {MAX_ACTOR_LENGTH} characters, got {len(name)}")
        return cls(actor=name)

    @classmethod
    def as_user(cls, username: str) -> Operator:
        """The Django user ``username``, who must be able to enter the admin; raises ``CommandError`` otherwise."""
        users = get_user_model()._default_manager
        try:
            user = users.get_by_natural_key(username)
        except users.model.DoesNotExist:
            raise CommandError(f"--as-user: there is no user {username!r}") from None
        model_admin = run_admin()
        operator = cls(actor=user.get_username(), user=user, model_admin=model_admin)
        operator.request.user = user
        if not model_admin.admin_site.has_permission(operator.request):
            raise CommandError(f"--as-user: {username} may not use the admin (they must be active and staff)")
        return operator

    @property
    def who(self) -> str:
        """How refusals name the operator."""
        return self.actor if self.user is not None else "this operator"

    def runs(self) -> QuerySet[WorkflowRun]:
        """The runs the operator may look at: with a user, those the admin's list would offer them."""
        if self.model_admin is None:
            return WorkflowRun.objects.all()
        return self.model_admin.get_queryset(self.request)

    def may_view_runs(self) -> bool:
        """Whether the operator may list and show runs at all."""
        return self.model_admin is None or bool(self.model_admin.has_view_permission(self.request))

    def may_view(self, model: type[Model]) -> bool:
        """Whether the operator may see ``model``'s rows (a run's attempts, events, signals), as its admin says."""
        return self.model_admin is None or may_view(self.model_admin.admin_site, self.request, model)

    def may(self, op: Operation, run: WorkflowRun) -> bool:
        """Whether the operator may take ``op`` on ``run`` (the admin's ``may_operate``)."""
        return self.model_admin is None or self.model_admin.may_operate(self.request, op, run)


@dataclass
class Result:
    """What one verb did to one run, or why it was refused."""

    run: str  #: the workflow id (as given, when no run was found)
    verb: str
    ok: bool
    message: str
    error_class: str | None = None
    status: str | None = None
    current_step: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form ``--json`` prints."""
        fields = {"run": self.run, "verb": self.verb, "ok": self.ok, "message": self.message}
        if not self.ok:
            return {**fields, "error_class": self.error_class}
        return {**fields, "status": self.status, "current_step": self.current_step, **self.extra}


def operate(operator: Operator, op: Operation, run_ids: list[str], data: dict[str, Any]) -> list[Result]:
    """Take ``op`` on each run in turn, each in its own transaction; one result per id, in order."""
    return [_operate_one(operator, op, text, data) for text in run_ids]


def _operate_one(operator: Operator, op: Operation, text: str, data: dict[str, Any]) -> Result:
    verb = op.verb
    try:
        run = find_run(operator.runs(), text)
    except RunNotFound as error:
        return Result(text, verb, ok=False, message=str(error), error_class="RunNotFound")
    workflow_id = str(run.workflow_id)
    if not operator.may(op, run):
        needs = f"the permission pgbus_workflows.{op.permission}_workflowrun and the view permission on the run"
        message = f"{operator.who} may not {verb.replace('_', ' ')} it (it needs {needs})"
        return Result(workflow_id, verb, ok=False, message=message, error_class="PermissionDenied")
    try:
        outcome = perform(op, run.pk, data, operator.actor)
    except WorkflowRun.DoesNotExist:
        return Result(workflow_id, verb, ok=False, message="it no longer exists", error_class="DoesNotExist")
    except (WorkflowError, ValueError) as error:
        return Result(workflow_id, verb, ok=False, message=str(error), error_class=type(error).__name__)
    if isinstance(outcome, WorkflowSignal):
        duplicate = bool(outcome.duplicate_delivery)
        message = "already delivered with this idempotency key: nothing changed" if duplicate else str(op.done)
        signal: dict[str, Any] = {"id": outcome.pk, "name": outcome.name, "status": outcome.status}
        extra = {"signal": signal, "duplicate_delivery": duplicate}
        now = WorkflowRun.objects.get(pk=run.pk)
        return Result(workflow_id, verb, True, message, status=now.status, current_step=now.current_step, extra=extra)
    if verb in ("rerun", "fork"):
        new = {"new_run": str(outcome.workflow_id), "new_status": outcome.status}
        message = f"{verb} as {outcome.workflow_id}"
        if verb == "fork":
            message += f" from step {outcome.current_step}"
        return Result(workflow_id, verb, True, message, status=run.status, current_step=run.current_step, extra=new)
    return Result(workflow_id, verb, True, str(op.done), status=outcome.status, current_step=outcome.current_step)


def show_page(operator: Operator, run: WorkflowRun, attempts: int, events: int, signals: int) -> dict[str, Any]:
    """What ``workflows show`` and the MCP tool ``show_run`` print of a run: its fields, the verbs the
    operator may take on it now, what holds it back, its latest attempts and events, its pending
    signals (a list is None when the operator may not view its rows).

    A step's error text, in the pause reason and in the events that quote it, only to an operator
    who may view the attempts: withheld as the admin withholds it (``admin.records``).
    """
    now, active = clock.now(), active_attempt(run)
    allowed = allowed_verbs(run, active, now)
    holds = held_back(active, now) if active is not None else []
    errors = operator.may_view(WorkflowStep)
    page: dict[str, Any] = {
        "run": {**run_details(run), "paused_reason": paused_reason_shown(run.paused_reason, errors)},
        "allowed_verbs": [op.verb for op in OPERATIONS.values() if op.verb in allowed and operator.may(op, run)],
        "held_back": {"step": active.step_name, "limits": holds} if active is not None and holds else None,
        "undeclared_limits": undeclared(active, run.workflow_class),
        "attempts": None,
        "older_attempts_omitted": False,
        "events": None,
        "older_events_omitted": False,
        "pending_signals": None,
        "more_signals_omitted": False,
    }
    if errors:
        steps, page["older_attempts_omitted"] = latest(WorkflowStep.objects.filter(run_id=run.pk), attempts)
        page["attempts"] = [attempt_row(step) for step in steps]
    if operator.may_view(WorkflowEvent):
        rows, page["older_events_omitted"] = latest(WorkflowEvent.objects.filter(run_id=run.pk), events)
        page["events"] = [event_row(event) for event in rows]
        for row, event in zip(page["events"], rows, strict=True):
            row["reason"], row["details"] = event_shown(event, errors)
    if operator.may_view(WorkflowSignal):
        pending, page["more_signals_omitted"] = pending_signals(run, signals)
        page["pending_signals"] = [signal_row(signal) for signal in pending]
    return page
