"""``manage.py workflows schedules list|pause|resume|fire-now``: the schedule admin's verbs from a terminal.

A schedule is named by its id (``list`` shows it) or by ``CLASS:NAME``. The verbs are
``services.schedules.pause``, ``resume`` and ``fire_now``, as the schedule admin's buttons call
them. Who acts is the run verbs' :class:`~pgbus_workflows.operating.operators.Operator`: the
trusted shell (``--actor``), or with ``--as-user`` a Django user asked as the schedule admin
asks (``WorkflowScheduleAdmin.may_operate``: the verb's permission, pause or fire, and the
view permission on the schedule).
"""

from __future__ import annotations

from argparse import _SubParsersAction
from dataclasses import dataclass, field
from typing import Any

from django.contrib.admin.sites import AdminSite, all_sites, site
from django.core.management.base import CommandError, CommandParser
from django.db.models import QuerySet

from ..admin.schedules import CANCEL_PERMISSION, SCHEDULE_OPERATIONS, WorkflowScheduleAdmin, cancels
from ..dsl.declared import registry
from ..exceptions import WorkflowError
from ..models import WorkflowSchedule
from ..services import schedules as verbs
from .operators import Operator
from .terminal import table, to_json

#: Subcommand -> the verb of ``services.schedules`` it calls.
SCHEDULE_VERBS = {"pause": "pause", "resume": "resume", "fire-now": "fire_now"}
#: How a refusal names what the operator may not do.
ACTS = {"pause": "pause it", "resume": "resume it", "fire_now": "fire it now"}

SCHEDULE_COLUMNS = [
    ("id", "id"),
    ("workflow_class", "class"),
    ("name", "name"),
    ("state", "state"),
    ("in_words", "when"),
    ("next_fire_at", "next fire"),
    ("last_fired_at", "last fired"),
]


#: An id longer than this is no schedule's (a bigint has at most 19 digits).
MAX_ID_DIGITS = 18


class ScheduleNotFound(Exception):
    """No schedule (that the operator may see) is named so."""


def schedule_admin() -> WorkflowScheduleAdmin:
    """The ``WorkflowScheduleAdmin`` the project registered (the default site first), else the app's own."""
    sites: list[AdminSite] = [site, *sorted((s for s in all_sites if s is not site), key=lambda s: s.name)]
    for candidate in sites:
        if candidate.is_registered(WorkflowSchedule):
            model_admin = candidate.get_model_admin(WorkflowSchedule)
            if isinstance(model_admin, WorkflowScheduleAdmin):
                return model_admin
    return WorkflowScheduleAdmin(WorkflowSchedule, site)


def add_schedule_commands(commands: _SubParsersAction, output: CommandParser, acting: CommandParser) -> None:
    """``schedules`` and its subcommands, under the command's subcommands."""
    schedules = commands.add_parser("schedules", help="list, pause, resume or fire schedules")
    under = schedules.add_subparsers(dest="schedule_command", required=True, metavar="SCHEDULE_COMMAND")
    listing = under.add_parser("list", parents=[output], help="every schedule: its state, next and last fire")
    listing.add_argument("--class", dest="classes", action="append", metavar="NAME", help="workflow class (repeatable)")
    helps = {
        "pause": "stop the schedules' ticks until resumed (a running run goes on)",
        "resume": "resume paused schedules: the next tick is the first from now",
        "fire-now": "start a run of each schedule now, as its overlap policy allows",
    }
    for name, text in helps.items():
        sub = under.add_parser(name, parents=[acting], help=text)
        sub.add_argument("schedules", nargs="+", metavar="SCHEDULE", help="a schedule's id, or CLASS:NAME")


def find_schedule(schedules: QuerySet[WorkflowSchedule], text: str) -> WorkflowSchedule:
    """The schedule named ``text`` (its id, or ``CLASS:NAME``) among ``schedules``."""
    if text.isascii() and text.isdigit():  # "²".isdigit() too, and int() refuses it
        if len(text) > MAX_ID_DIGITS:
            raise ScheduleNotFound(f"there is no schedule {text}")
        found = schedules.filter(pk=int(text)).first()
    elif ":" in text:
        klass, name = text.split(":", 1)
        found = schedules.filter(workflow_class=klass, name=name).first()
    else:
        raise ScheduleNotFound(f"{text!r} is not a schedule (its id, or CLASS:NAME)")
    if found is None:
        raise ScheduleNotFound(f"there is no schedule {text}")
    return found


def state(schedule: WorkflowSchedule) -> str:
    """``active``, ``paused``, ``disabled`` (in code) or ``class not registered``, as the admin's list says."""
    if not registry.is_registered(schedule.workflow_class):
        return "class not registered"
    if not schedule.enabled:
        return "disabled"
    return "paused" if schedule.paused else "active"


def schedule_row(schedule: WorkflowSchedule) -> dict[str, Any]:
    """A schedule as ``list`` prints it (and ``--json`` has it)."""
    return {
        "id": schedule.pk,
        "workflow_class": schedule.workflow_class,
        "name": schedule.name,
        "state": state(schedule),
        "expression": schedule.expression,
        "in_words": schedule.in_words,
        "next_fire_at": schedule.next_fire_at if schedule.enabled and not schedule.paused else None,
        "last_fired_at": schedule.last_fired_at,
    }


@dataclass
class ScheduleResult:
    """What one verb did to one schedule, or why it was refused."""

    schedule: str  #: ``CLASS:NAME`` (as given, when no schedule was found)
    verb: str
    ok: bool
    message: str
    error_class: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form ``--json`` prints."""
        fields = {"schedule": self.schedule, "verb": self.verb, "ok": self.ok, "message": self.message}
        return {**fields, "error_class": self.error_class} if not self.ok else {**fields, **self.extra}


class ScheduleCommands:
    """The ``schedules`` subcommands, for ``operator``; each writes through the command's streams."""

    def __init__(self, operator: Operator) -> None:
        """``operator`` acts; with a user, the schedule admin decides what they may see and do."""
        self.operator = operator
        self.model_admin = schedule_admin() if operator.user is not None else None

    def schedules(self) -> QuerySet[WorkflowSchedule]:
        """The schedules the operator may see (with a user: if they may view schedules at all)."""
        if self.model_admin is None:
            return WorkflowSchedule.objects.all()
        if not self.model_admin.has_view_permission(self.operator.request):
            raise CommandError(f"{self.operator.who} may not view workflow schedules")
        return self.model_admin.get_queryset(self.operator.request)

    def list_lines(self, classes: list[str] | None, as_json: bool) -> str:
        """``schedules list``: every schedule (of ``classes``), by class and name."""
        schedules = self.schedules().order_by("workflow_class", "name")
        if classes:
            schedules = schedules.filter(workflow_class__in=classes)
        rows = [schedule_row(schedule) for schedule in schedules]
        if as_json:
            return to_json(rows)
        if not rows:
            return "No schedules."
        return "\n".join(table(rows, SCHEDULE_COLUMNS))

    def operate(self, verb: str, names: list[str], reason: str | None) -> list[ScheduleResult]:
        """Take ``verb`` on each schedule named, each in its own transaction; one result per name."""
        return [self._one(verb, text, reason) for text in names]

    def _one(self, verb: str, text: str, reason: str | None) -> ScheduleResult:
        try:
            schedule = find_schedule(self.schedules(), text)
        except ScheduleNotFound as error:
            return ScheduleResult(text, verb, ok=False, message=str(error), error_class="ScheduleNotFound")
        label = f"{schedule.workflow_class}:{schedule.name}"
        if self.model_admin is not None and not self.model_admin.may_operate(self.operator.request, verb, schedule):
            permission = SCHEDULE_OPERATIONS[verb][0]
            needs = f"the permission pgbus_workflows.{permission}_workflowschedule and the view permission on it"
            if verb == "fire_now" and cancels(schedule):
                needs += f", and {CANCEL_PERMISSION} (its overlap cancels the previous run)"
            message = f"{self.operator.who} may not {ACTS[verb]} (it needs {needs})"
            return ScheduleResult(label, verb, ok=False, message=message, error_class="PermissionDenied")
        try:
            outcome = getattr(verbs, verb)(schedule.pk, actor=self.operator.actor, reason=reason)
        except WorkflowSchedule.DoesNotExist:
            return ScheduleResult(label, verb, ok=False, message="it no longer exists", error_class="DoesNotExist")
        except WorkflowError as error:
            return ScheduleResult(label, verb, ok=False, message=str(error), error_class=type(error).__name__)
        if verb == "fire_now":
            run = {"run": str(outcome.workflow_id), "run_status": outcome.status}
            return ScheduleResult(label, verb, True, f"fired: run {outcome.workflow_id} ({outcome.status})", extra=run)
        row = schedule_row(outcome)
        extra = {"state": row["state"], "next_fire_at": row["next_fire_at"]}
        return ScheduleResult(label, verb, True, str(SCHEDULE_OPERATIONS[verb][2]), extra=extra)
