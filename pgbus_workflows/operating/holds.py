"""``manage.py workflows hold|release|holds``: hold a workflow class or a queue from a terminal.

``hold CLASS`` (or ``hold --queue NAME``) and ``release CLASS`` (``--queue NAME``) call
:mod:`pgbus_workflows.services.holding`; ``holds`` lists the holds in force. With
``--as-user`` the user needs the ``hold_workflowrun`` permission, as in the admin.
"""

from __future__ import annotations

from argparse import _SubParsersAction
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ..dsl.declared import NotRegistered
from ..models import WorkflowHold
from ..services import holding
from .operators import Operator

#: The permission a user needs to hold and release (``app_label.codename``).
HOLD_PERMISSION = "pgbus_workflows.hold_workflowrun"


def add_hold_commands(commands: _SubParsersAction, output: CommandParser, acting: CommandParser) -> None:
    """``hold``, ``release`` and ``holds``, under the command's subcommands."""
    helps = {
        "hold": "stop the claims of a workflow class's steps (or a queue's) until released; runs keep their status",
        "release": "release a hold: the held steps are claimed in due order",
    }
    for name, text in helps.items():
        sub = commands.add_parser(name, parents=[acting], help=text)
        target = sub.add_mutually_exclusive_group(required=True)
        target.add_argument("workflow_class", nargs="?", metavar="CLASS", help="a registered workflow class's name")
        target.add_argument("--queue", metavar="NAME", help="a queue instead of a class")
    commands.add_parser("holds", parents=[output], help="the holds in force: what, since when, by whom, why")


def hold_row(hold: WorkflowHold) -> dict[str, Any]:
    """A hold as the CLI, MCP and the health report show it."""
    return {
        "kind": hold.kind,
        "name": hold.name,
        "held_at": hold.held_at.isoformat(),
        "held_by": hold.held_by,
        "reason": hold.reason,
        "released_at": hold.released_at.isoformat() if hold.released_at else None,
        "released_by": hold.released_by or None,
    }


def hold_line(hold: WorkflowHold) -> str:
    """``class held_work held since <time> by ops: mail down``."""
    since = f"{hold.held_at:%Y-%m-%d %H:%M:%S %Z}"
    return f"{hold.kind} {hold.name} held since {since} by {hold.held_by}: {hold.reason or '-'}"


def run_hold_command(operator: Operator, options: dict[str, Any]) -> tuple[str, dict[str, Any] | list[Any]]:
    """Run ``hold``, ``release`` or ``holds``: the text to print and the JSON document."""
    if options["subcommand"] == "holds":
        if not operator.may_view_runs():
            raise CommandError(f"{operator.who} may not view workflow runs")
        holds = holding.active_holds()
        text = "\n".join(hold_line(h) for h in holds) or "Nothing is held."
        return text, [hold_row(h) for h in holds]
    if operator.user is not None and not operator.user.has_perm(HOLD_PERMISSION):
        raise CommandError(f"{operator.who} may not hold or release (permission {HOLD_PERMISSION})")
    queue, klass, reason = options["queue"], options["workflow_class"], options["reason"] or None
    try:
        if options["subcommand"] == "hold":
            hold = (
                holding.hold_queue(queue, operator.actor, reason)
                if queue is not None
                else holding.hold_class(klass, operator.actor, reason)
            )
            return hold_line(hold), hold_row(hold)
        released = (
            holding.release_queue(queue, operator.actor, reason)
            if queue is not None
            else holding.release_class(klass, operator.actor, reason)
        )
    except (NotRegistered, ValueError) as error:
        raise CommandError(str(error)) from None
    what = f"queue {queue}" if queue is not None else f"class {klass}"
    if released is None:
        return f"{what} was not held", {"released": False}
    return f"{what} released (held since {released.held_at:%Y-%m-%d %H:%M:%S %Z} by {released.held_by})", {
        "released": True,
        **hold_row(released),
    }
