"""``manage.py run_workflow_dispatcher``: run workflow steps and the sweep."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import InterfaceError, OperationalError, transaction

from ...dispatcher import WorkflowDispatcher
from ...exceptions import NotMigrated

LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def non_negative_int(value: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {number}")
    return number


def non_negative_seconds(value: str) -> float:
    """argparse type: a number of seconds >= 0."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return seconds


def port_number(value: str) -> int:
    """argparse type: a TCP port, 1 to 65535."""
    number = positive_int(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {number}")
    return number


def queue_name(value: str) -> str:
    """argparse type: a non-empty queue name."""
    if not value.strip():
        raise argparse.ArgumentTypeError("a queue name must not be empty")
    return value.strip()


class Command(BaseCommand):
    """Run a workflow dispatcher until SIGTERM/SIGINT (or, with --once, until nothing is due)."""

    help = (
        "Run workflow steps (worker threads woken by LISTEN/NOTIFY) and the sweep. "
        "SIGTERM/SIGINT: finish running steps and exit 0; a second signal exits at once."
    )

    def configure_logging(self, verbosity: int) -> None:
        """Set the ``pgbus_workflows`` logger's level from ``--verbosity``.

        The project's logging configuration is kept: records propagate to its handlers. Only
        when nothing would show them (no handler on the logger or its ancestors) does the
        command add one, writing to its own stdout (so ``call_command(stdout=...)`` gets them).
        """
        logger = logging.getLogger("pgbus_workflows")
        logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
        if not logger.hasHandlers():
            handler = logging.StreamHandler(self.stdout)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(message)s"))
            logger.addHandler(handler)

    def serve_metrics(self, port: int, address: str) -> None:
        """Start the metrics endpoint, or stop with one clear line (the extra missing, the port taken)."""
        try:
            from ... import metrics
        except ImportError as error:
            raise CommandError(str(error)) from None
        try:
            metrics.serve(port, address)
        except OSError as error:
            raise CommandError(f"--metrics-port {port}: cannot listen on {address}:{port}: {error.strerror}") from None
        logging.getLogger("pgbus_workflows").info("Serving metrics on %s:%s", address, port)

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare the flags; every value is validated here, not deep in the loop."""
        parser.add_argument(
            "--concurrency", type=positive_int, default=4, help="worker threads, each with its own connection (4)"
        )
        parser.add_argument(
            "--async-concurrency",
            type=non_negative_int,
            metavar="N",
            help="async def bodies awaiting at once on the event loop holding no thread "
            "(past them, and with 0, each holds its worker; default: the setting ASYNC_CONCURRENCY, 100)",
        )
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            type=queue_name,
            metavar="NAME",
            help="serve only this queue (repeatable; default: every queue)",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="run the sweep once, fire due schedule ticks, drain what is due, then exit",
        )
        sweep = parser.add_mutually_exclusive_group()
        sweep.add_argument("--no-sweep", action="store_true", help="never run the sweep in this process")
        sweep.add_argument("--sweep-only", action="store_true", help="run only the sweep (no steps)")
        parser.add_argument(
            "--no-schedules",
            action="store_true",
            help="never fire schedule ticks in this process (another dispatcher leads them)",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=non_negative_seconds,
            default=30.0,
            metavar="S",
            help="seconds to let running steps finish after SIGTERM (30)",
        )
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            metavar="N",
            help="serve this process's Prometheus metrics on port N (needs pgbus-workflows[prometheus])",
        )
        parser.add_argument(
            "--metrics-address",
            default="0.0.0.0",  # noqa: S104 - the scraper is usually on another host
            metavar="HOST",
            help="the address --metrics-port listens on (0.0.0.0: every interface)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Configure logging from --verbosity and run the dispatcher; refused inside an open transaction."""
        if transaction.get_connection().in_atomic_block:
            # The claims would run on the caller's connection, inside its transaction: a task or
            # a step it wrote would run before it commits, where no other connection sees it.
            raise CommandError(
                "run_workflow_dispatcher cannot run inside an open transaction (transaction.atomic(), "
                "or a TestCase): call it outside atomic(), in a test from a TransactionTestCase"
            )
        self.configure_logging(options["verbosity"])
        if options["metrics_port"] is not None:
            self.serve_metrics(options["metrics_port"], options["metrics_address"])
        dispatcher = WorkflowDispatcher(
            concurrency=options["concurrency"],
            async_concurrency=options["async_concurrency"],
            queues=options["queues"],
            once=options["once"],
            sweep=not options["no_sweep"],
            sweep_only=options["sweep_only"],
            shutdown_timeout=options["shutdown_timeout"],
            schedules=not options["no_schedules"],
        )
        try:
            code = dispatcher.run()
        except NotMigrated as error:
            self.stderr.write(str(error))
            sys.exit(1)
        except (OperationalError, InterfaceError) as error:
            if options["traceback"]:
                raise
            # The database is down or refuses the login: one line for the supervisor's log.
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            self.stderr.write(f"Cannot use the database: {first}")
            sys.exit(1)
        if code:
            sys.exit(code)
