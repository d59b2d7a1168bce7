"""``manage.py workflows``: list, inspect and operate workflow runs from a terminal.

``list`` and ``show`` read; ``pause``, ``resume`` (``--at STEP``), ``cancel``, ``rerun``,
``fork`` (``--from-step STEP``), ``run-now``, ``skip`` and ``signal`` call the admin's verbs on one or more runs, each
reporting done or refused (exit 1 if any was refused). ``health`` gives the verdict of
:mod:`pgbus_workflows.services.health` and its reasons (exit 1 when not healthy).
``schedules list|pause|resume|fire-now`` does the same for schedules
(:mod:`pgbus_workflows.operating.schedules`). ``hold``, ``release`` and ``holds``
for classes and queues (:mod:`pgbus_workflows.operating.holds`). ``limits``: the busy concurrency
keys and rate limits (:mod:`pgbus_workflows.operating.limits`). ``--json`` prints one JSON document.
Who acts and what they may do: :mod:`pgbus_workflows.operating.operators`.
"""

from __future__ import annotations

import json
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, InterfaceError, OperationalError

from ... import migrated
from ...admin.forms import MAX_REASON_LENGTH
from ...admin.operations import OPERATIONS
from ...exceptions import PayloadNotSerializable, PayloadTooLarge
from ...models.reading import reading
from ...operating.holds import add_hold_commands, run_hold_command
from ...operating.limits import add_limits_command, run_limits_command
from ...operating.operators import Operator, Result, operate, show_page
from ...operating.runs import (
    RunNotFound,
    Subject,
    find_run,
    list_runs,
    run_row,
    with_latest_attempt,
)
from ...operating.schedules import SCHEDULE_VERBS, ScheduleCommands, add_schedule_commands
from ...operating.terminal import RUN_COLUMNS, health_lines, run_page, table, to_json
from ...services.health import check_health
from ...services.payload import encode_payload
from ...services.signals import check_signal_input
from ...services.stuck import STUCK_REASONS
from ...sql.replica import read_lag
from ...states import RunStatus
from .run_workflow_dispatcher import positive_int

#: Subcommand -> the operator verb it calls (``resume --at`` calls ``resume_at``).
VERBS = {
    "pause": "pause",
    "resume": "resume",
    "cancel": "cancel",
    "rerun": "rerun",
    "fork": "fork",
    "run-now": "run_now",
    "skip": "skip",
    "signal": "signal",
}

ACTING = """Without --as-user the command acts as a trusted system operator (a shell on the
server is trusted like `manage.py shell`): no permission is checked, and events record
--actor (default cli:<os user>). With --as-user USERNAME, that Django user's permissions are
checked exactly as the admin checks them (active staff, the verb's permission and the view
permission on each run), and their username is the actor."""


def reason_text(value: str) -> str:
    """``--reason``: at most the admin's ``MAX_REASON_LENGTH`` characters."""
    if len(value) > MAX_REASON_LENGTH:
        raise ArgumentTypeError(f"at most {MAX_REASON_LENGTH} characters (as in the admin), got {len(value)}")
    return value


class Command(BaseCommand):
    """List, show and operate workflow runs (the admin's verbs, from a terminal)."""

    help = "List, show and operate workflow runs: the admin's verbs from a terminal. " + " ".join(ACTING.split())

    def add_arguments(self, parser: CommandParser) -> None:
        """One subcommand per verb; every value is checked before anything is read or written."""
        output = CommandParser(add_help=False)
        output.add_argument("--json", action="store_true", help="print one JSON document (for scripts)")
        output.add_argument("--as-user", metavar="USERNAME", help="act as this Django user, with their permissions")
        acting = CommandParser(add_help=False, parents=[output])
        acting.add_argument("--actor", help="the name recorded on the events (default cli:<os user>)")
        acting.add_argument(
            "--reason",
            type=reason_text,
            help=f"why: recorded on the events, as the admin's reason (at most {MAX_REASON_LENGTH} characters)",
        )
        commands = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

        listing = commands.add_parser(
            "list", parents=[output], help="the newest runs matching the filters", description=ACTING
        )
        listing.add_argument(
            "--class", dest="classes", action="append", metavar="NAME", help="workflow class (repeatable)"
        )
        listing.add_argument(
            "--status", dest="statuses", action="append", choices=RunStatus.values, help="(repeatable)"
        )
        listing.add_argument(
            "--stuck", choices=STUCK_REASONS, help="runs stuck for this reason (as the admin's filter)"
        )
        listing.add_argument("--subject", help="app_label.model:pk (one subject) or app_label.model")
        listing.add_argument("--limit", type=positive_int, default=50, help="how many, newest first (50)")
        listing.add_argument("--ids", action="store_true", help="print only the workflow ids, one a line (for xargs)")

        show = commands.add_parser(
            "show", parents=[output], help="a run: its attempts, events and pending signals", description=ACTING
        )
        show.add_argument("run_id", metavar="RUN_ID", help="a workflow id, or its first 8 characters or more")
        show.add_argument("--attempts", type=positive_int, default=50, metavar="N", help="latest attempts shown (50)")
        show.add_argument("--events", type=positive_int, default=20, metavar="N", help="latest events shown (20)")
        show.add_argument("--signals", type=positive_int, default=50, metavar="N", help="pending signals shown (50)")
        show.add_argument(
            "--full",
            action="store_true",
            help="print every value whole (by default long ones are cut at 60 characters)",
        )

        commands.add_parser(
            "health",
            parents=[output],
            help="is everything OK: the verdict and its reasons (exit 1 when not healthy)",
            description=ACTING,
        )

        helps = {
            "pause": "hold runs: a running step finishes, nothing new starts",
            "resume": "resume paused runs (--at STEP: at that step, now)",
            "cancel": "cancel ongoing runs",
            "rerun": "start a new run like each finished or cancelled one",
            "fork": "start a new run like each one at a step, keeping the outputs of the steps before it",
            "run-now": "cut short the wait of each run's scheduled step (or end a signal wait)",
            "skip": "skip the current step of each run",
            "signal": "deliver a signal to runs",
        }
        for name, text in helps.items():
            sub = commands.add_parser(name, parents=[acting], help=text, description=ACTING)
            if name == "signal":
                sub.add_argument("name", metavar="NAME", help="the signal's name")
                sub.add_argument("--payload", default="", metavar="JSON", help="its payload, a JSON value ({})")
                sub.add_argument(
                    "--idempotency-key", default="", metavar="KEY", help="a repeat with this key changes nothing"
                )
            if name == "fork":
                sub.add_argument(
                    "--from-step",
                    metavar="STEP",
                    help="the fork starts at this step (default: the first); earlier steps keep their outputs",
                )
            if name == "resume":
                sub.add_argument("--at", metavar="STEP", help="resume at this step, now (needs the skip permission)")
            sub.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="workflow ids (or their first 8+ characters)")
        add_schedule_commands(commands, output, acting)
        add_hold_commands(commands, output, acting)
        add_limits_command(commands, output)

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the subcommand; a database without the migrations is one line, not a traceback."""
        try:
            if options["subcommand"] == "list":
                self.list_runs(options)
            elif options["subcommand"] == "show":
                self.show_run(options)
            elif options["subcommand"] == "schedules":
                self.schedule_command(options)
            elif options["subcommand"] == "health":
                self.health(options)
            elif options["subcommand"] in ("hold", "release", "holds"):
                text, document = run_hold_command(self.operator(options), options)
                self.stdout.write(to_json(document) if options["json"] else text)
            elif options["subcommand"] == "limits":
                text, report = run_limits_command(self.operator(options), options)
                self.stdout.write(to_json(report) if options["json"] else text)
            else:
                self.operate(VERBS[options["subcommand"]], options)
        except (OperationalError, InterfaceError) as error:
            # The database is down, unreachable or refuses the login: one line, not a traceback
            # (--traceback still shows it, chained).
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CommandError(f"Cannot use the database: {first}") from error
        except DatabaseError as error:
            missing = migrated.explain(error)
            if missing is None:
                raise
            raise CommandError(str(missing)) from error

    def operator(self, options: dict[str, Any]) -> Operator:
        """The system operator, or (``--as-user``) the Django user, who acts."""
        if options["as_user"] is None:
            return Operator.system(options.get("actor"))
        if options.get("actor") is not None:
            raise CommandError("--actor and --as-user do not go together: the user's username is the actor")
        return Operator.as_user(options["as_user"])

    def viewer(self, options: dict[str, Any]) -> Operator:
        """The operator, who must be allowed to view runs."""
        operator = self.operator(options)
        if not operator.may_view_runs():
            raise CommandError(f"{operator.who} may not view workflow runs")
        return operator

    def list_runs(self, options: dict[str, Any]) -> None:
        """``list``: a table (or JSON, or ids) of the newest runs matching the filters."""
        operator = self.viewer(options)
        try:
            subject = Subject.parse(options["subject"]) if options["subject"] is not None else None
        except ValueError as error:
            raise CommandError(f"--subject: {error}") from None
        with reading() as alias:  # a list decides nothing: READ_DATABASE, with its lag in the footer
            runs, more = list_runs(
                operator.runs(),
                classes=options["classes"] or (),
                statuses=options["statuses"] or (),
                stuck=options["stuck"],
                subject=subject,
                limit=options["limit"],
            )
            rows = [run_row(run) for run in runs]
            lag = read_lag(alias)
        if options["json"]:
            self.stdout.write(to_json(rows))
        elif options["ids"]:
            self.stdout.write("".join(f"{row['workflow_id']}\n" for row in rows), ending="")
        elif not rows:
            self.stdout.write("No runs match.")
        else:
            self.stdout.write("\n".join(table(rows, RUN_COLUMNS)))
            tail = "; more match (raise --limit or narrow the filters)" if more else ""
            self.stdout.write(f"{len(rows)} run{'s' if len(rows) > 1 else ''}, newest first{tail}")
        if lag.elsewhere and not (options["json"] or options["ids"]):
            self.stdout.write(f"Rows {lag.sentence()}.")

    def show_run(self, options: dict[str, Any]) -> None:
        """``show RUN_ID``: the run, the verbs it may take, its attempts, events and pending signals."""
        operator = self.viewer(options)
        try:
            run = find_run(with_latest_attempt(operator.runs()), options["run_id"])
        except RunNotFound as error:
            raise CommandError(str(error)) from None
        page = show_page(operator, run, options["attempts"], options["events"], options["signals"])
        self.stdout.write(to_json(page) if options["json"] else "\n".join(run_page(page, options["full"])))

    def health(self, options: dict[str, Any]) -> None:
        """``health``: the verdict, its reasons and notes, the dispatchers and the figures; exit 1 when not healthy."""
        self.viewer(options)
        report = check_health().as_dict()
        self.stdout.write(to_json(report) if options["json"] else "\n".join(health_lines(report)))
        if not report["healthy"]:
            raise CommandError(f"not healthy: {'; '.join(report['reasons'])}")

    def operate(self, verb: str, options: dict[str, Any]) -> None:
        """A verb on each run given: one line (or JSON object) per run; exit 1 if any was refused."""
        operator = self.operator(options)
        data: dict[str, Any] = {"reason": options["reason"] or None}
        if verb == "resume" and options["at"] is not None:
            verb, data["step"] = "resume_at", options["at"]
        if verb == "fork":
            data["from_step"] = options["from_step"]
        if verb == "signal":
            data.update(self.signal_data(options, operator))
        results = operate(operator, OPERATIONS[verb], options["run_ids"], data)
        if options["json"]:
            self.stdout.write(to_json([result.as_dict() for result in results]))
        refused = [result for result in results if not result.ok]
        if len(results) == 1 and refused:
            raise CommandError(f"{refused[0].run}: {refused[0].message}")
        if not options["json"]:
            for result in results:
                self.report(result)
        if refused:
            raise CommandError(f"{len(refused)} of {len(results)} runs refused")

    def schedule_command(self, options: dict[str, Any]) -> None:
        """``schedules list``, or a verb on each schedule given, reported as the run verbs report."""
        commands = ScheduleCommands(self.operator(options))
        if options["schedule_command"] == "list":
            self.stdout.write(commands.list_lines(options["classes"], options["json"]))
            return
        verb = SCHEDULE_VERBS[options["schedule_command"]]
        results = commands.operate(verb, options["schedules"], options["reason"] or None)
        if options["json"]:
            self.stdout.write(to_json([result.as_dict() for result in results]))
        refused = [result for result in results if not result.ok]
        if len(results) == 1 and refused:
            raise CommandError(f"{refused[0].schedule}: {refused[0].message}")
        if not options["json"]:
            for result in results:
                if result.ok:
                    self.stdout.write(f"{result.schedule}  {result.message}")
                else:
                    self.stderr.write(f"{result.schedule}  refused: {result.message}")
        if refused:
            raise CommandError(f"{len(refused)} of {len(results)} schedules refused")

    def report(self, result: Result) -> None:
        """One run's line: what was done on stdout, a refusal on stderr."""
        if not result.ok:
            self.stderr.write(f"{result.run}  refused: {result.message}")
        elif result.verb in ("rerun", "fork"):
            self.stdout.write(f"{result.run}  {result.message} ({result.extra['new_status']})")
        else:
            self.stdout.write(f"{result.run}  {result.message} (now {result.status}, step {result.current_step})")

    def signal_data(self, options: dict[str, Any], operator: Operator) -> dict[str, Any]:
        """The signal's name, payload and key, checked as the admin's form checks them."""
        key = options["idempotency_key"].strip() or None
        try:
            check_signal_input(options["name"], key, operator.actor)
        except ValueError as error:
            raise CommandError(str(error)) from None
        text = options["payload"].strip()
        try:
            payload = json.loads(text) if text else None
        except json.JSONDecodeError as error:
            raise CommandError(f"--payload is not valid JSON: {error}") from None
        except RecursionError:
            raise CommandError("--payload is nested too deeply") from None
        try:
            payload = encode_payload(payload, "--payload")
        except (PayloadNotSerializable, PayloadTooLarge) as error:
            raise CommandError(str(error)) from None
        return {"name": options["name"], "payload": payload, "idempotency_key": key}
