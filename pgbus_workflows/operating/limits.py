"""``manage.py workflows limits``: the busy concurrency keys and rate limits, and the steps they hold back.

The same report as MCP's ``limits`` tool (:func:`limits_report`): the keys in use or holding
steps back (``services.limiters.busiest``), most held back (``--order in_use``: most in use)
first, each with its room now. With ``--as-user`` the user needs the view permissions on runs
and on limiters, as in the admin.
"""

from __future__ import annotations

from argparse import ArgumentTypeError, _SubParsersAction
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ..admin.limiters import room_text
from ..dsl.limits import CONCURRENCY, RATE
from ..models import WorkflowLimiter
from ..services.limiters import ORDERS, LimiterState, busiest, fixed_names
from ..sql import clock
from .operators import Operator
from .terminal import table

#: The most keys one report lists (MCP's ``limit`` and the CLI's ``--limit`` alike).
MAX_KEYS = 100

LIMIT_COLUMNS = [("name", "limiter"), ("room", "room now"), ("held_back", "held back")]


def key_count(value: str) -> int:
    """``--limit``: a whole number from 1 to :data:`MAX_KEYS`."""
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"must be a whole number, got {value!r}") from None
    if not 1 <= number <= MAX_KEYS:
        raise ArgumentTypeError(f"must be from 1 to {MAX_KEYS}, got {number}")
    return number


def add_limits_command(commands: _SubParsersAction, output: CommandParser) -> None:
    """``limits``, under the command's subcommands."""
    limits = commands.add_parser(
        "limits", parents=[output], help="the busy concurrency keys and rate limits and the steps they hold back"
    )
    limits.add_argument("--kind", choices=[CONCURRENCY, RATE], help="only concurrency keys, or only rate limits")
    limits.add_argument(
        "--order", choices=ORDERS, default="held_back", help="most steps held back first (default), or most in use"
    )
    limits.add_argument("--limit", type=key_count, default=20, help=f"how many keys (20; at most {MAX_KEYS})")


def busy_limiters(operator: Operator, kind: str | None, order: str) -> list[LimiterState]:
    """Every busy key of ``kind`` (None: both), busiest first by ``order``, if the operator may view limiters."""
    if not operator.may_view_runs():
        raise CommandError(f"{operator.who} may not view workflow runs")
    if not operator.may_view(WorkflowLimiter):
        raise CommandError(f"{operator.who} may not view workflow limiters")
    return busiest(clock.now(), kind, order)


def report_of(found: list[LimiterState], limit: int) -> dict[str, Any]:
    """The first ``limit`` of ``found``: ``limiters`` (each with ``fixed_key``: a key the code fixes, not one
    computed from a run's arguments), ``busy`` (every busy key), ``more`` (some left out), ``held_back``."""
    fixed = fixed_names()
    return {
        "limiters": [{**limiter.as_dict(), "fixed_key": limiter.name in fixed} for limiter in found[:limit]],
        "busy": len(found),
        "more": len(found) > limit,
        "held_back": sum(limiter.held_back for limiter in found),
    }


def limits_report(operator: Operator, kind: str | None, order: str, limit: int) -> dict[str, Any]:
    """The report MCP's ``limits`` tool and ``workflows limits --json`` give (:func:`report_of`)."""
    return report_of(busy_limiters(operator, kind, order), limit)


def run_limits_command(operator: Operator, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Run ``limits``: the text to print (a table, then how many were left out) and the JSON document."""
    found = busy_limiters(operator, options["kind"], options["order"])
    report = report_of(found, options["limit"])
    if not found:
        return "No limiter is in use or holds a step back.", report
    shown = found[: options["limit"]]
    rows = [{"name": s.name, "room": room_text(s), "held_back": s.held_back} for s in shown]
    lines = table(rows, LIMIT_COLUMNS, full=True)
    if report["more"]:
        lines.append(f"... and {len(found) - len(shown)} more (--limit)")
    return "\n".join(lines), report
