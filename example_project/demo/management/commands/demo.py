"""``manage.py demo``: the example workflows, run by a real dispatcher, watched live.

It creates sample sign-ups, orders and albums, starts their workflows, runs a
``WorkflowDispatcher`` in a thread of this process (one worker on SQLite), sends the
payment webhooks and an unsubscribe on a timeline, lets a payment wait time out, and
shows the runs by class and status until every run has ended the way it was designed
to. Exits 1 when a run did not.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Count
from django.test.utils import override_settings

from pgbus_workflows import signals
from pgbus_workflows.dispatcher import WorkflowDispatcher
from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.states import RunStatus

from ...facts import facts
from ...scenario import WORKFLOWS, Scenario, Tracked, full, quick, reset
from ...screen import Counts, Feed, Screen

SETTLED = (RunStatus.FINISHED, RunStatus.CANCELLED, RunStatus.PAUSED)
#: The demo's own dispatcher settings: sweep (timeouts) twice a second, poll four times.
FAST = {"SWEEP_INTERVAL": 0.5, "POLL_INTERVAL": 0.25, "HEARTBEAT_INTERVAL": 2}


def describe_database() -> str:
    """The first line: which database, and how to pick the other one."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        path = Path(str(db["NAME"]))
        try:
            shown = str(path.resolve().relative_to(Path.cwd()))
        except ValueError:
            shown = str(path)
        return (
            f"pgbus-workflows demo on SQLite ({shown}): no database server needed. "
            "Set DATABASE_URL=postgres://USER@HOST:5432/NAME to use PostgreSQL."
        )
    where = f"{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}"
    return f"pgbus-workflows demo on {connection.display_name} ({where}, from DATABASE_URL)."


def require_migrated() -> None:
    """Stop with the command to run when the database is not migrated."""
    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        raise CommandError("The database is not migrated: run `python manage.py migrate` (scripts/demo does it).")


class Command(BaseCommand):
    """Run the example workflows end to end and show them live."""

    help = (
        "Create sample data, start the example workflows, run a dispatcher in this process and "
        "show the runs live until each ends as designed (exit 1 otherwise). About a minute; --quick: seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """``--quick`` for CI."""
        parser.add_argument("--quick", action="store_true", help="a burst that settles in seconds (what CI runs)")

    def handle(self, *args: Any, **options: Any) -> None:
        """Set up, run the timeline with the dispatcher, print the summary."""
        self.stdout.write(describe_database())
        self.action_errors: list[Exception] = []
        require_migrated()
        deleted = reset()
        if deleted:
            self.stdout.write(f"Removed the sample data and the {deleted} runs of an earlier demo.")
        scenario = Scenario()
        (quick if options["quick"] else full)(scenario)
        concurrency = 1 if connection.vendor == "sqlite" else 4
        mode = "a short burst" if options["quick"] else "a minute of traffic (--quick: a short burst)"
        self.stdout.write(
            f"Running {mode}: sign-ups, orders, albums; a dispatcher with {concurrency} worker "
            f"thread{'s' if concurrency > 1 else ''} runs their steps. Ctrl-C stops.\n"
        )
        feed = Feed()
        fast = {**getattr(settings, "PGBUS_WORKFLOWS", {}), **FAST}
        with override_settings(PGBUS_WORKFLOWS=fast), _Listening(feed, scenario):
            elapsed = self._run(scenario, feed, concurrency, deadline=22.0 if options["quick"] else 90.0)
        self._summarize(scenario, elapsed)

    def _run(self, scenario: Scenario, feed: Feed, concurrency: int, deadline: float) -> float:
        """Play the timeline with the dispatcher running; returns the seconds it took."""
        started = time.monotonic()
        feed.clock = lambda: time.monotonic() - started
        dispatcher = WorkflowDispatcher(concurrency=concurrency, shutdown_timeout=10.0)
        failure: list[BaseException] = []
        thread = threading.Thread(target=_serve, args=(dispatcher, failure), name="demo-dispatcher", daemon=True)
        screen = Screen(self.stdout, [w.name for w in WORKFLOWS], tty=self.stdout.isatty())
        done: set[int] = set()
        thread.start()
        try:
            while True:
                elapsed = time.monotonic() - started
                for index, action in enumerate(list(scenario.actions)):
                    if index not in done and action.at <= elapsed:
                        done.add(index)
                        try:
                            line = action.run()
                        except Exception as error:  # reported in the summary: the demo exits 1
                            self.action_errors.append(error)
                            line = f"[error] {type(error).__name__}: {error}"
                        if line:
                            feed.add(line)
                counts = run_counts(scenario.tracked)
                waiting = len(scenario.actions) - len(done)
                status = (
                    f"{len(scenario.tracked)} runs started, {waiting} actions to come"
                    if waiting
                    else "waiting for every run to end as designed"
                )
                screen.update(time.monotonic() - started, counts, feed.take(), status)
                if not waiting and settled(scenario.tracked):
                    break
                if failure or not thread.is_alive():
                    raise CommandError(f"The dispatcher stopped: {failure[0] if failure else 'no reason given'}")
                if elapsed > deadline:
                    feed.add(f"still not settled after {deadline:.0f}s: giving up")
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            screen.finish()
            raise CommandError(
                "Interrupted. The runs stay in the database: `python manage.py run_workflow_dispatcher` carries on.",
                returncode=130,
            ) from None
        finally:
            dispatcher.stop()
            thread.join(timeout=15)
        elapsed = time.monotonic() - started
        screen.update(elapsed, run_counts(scenario.tracked), feed.take(), "done")
        screen.finish()
        return elapsed

    def _summarize(self, scenario: Scenario, elapsed: float) -> None:
        """Counts by class, the runs designed not to finish, the business results, then the admin."""
        final = statuses(scenario.tracked)
        by_class: dict[str, Counter[str]] = {w.name: Counter() for w in WORKFLOWS}
        for tracked in scenario.tracked:
            by_class[tracked.workflow_class][final.get(tracked.run_pk, "missing")] += 1
        width = max(len(name) for name in by_class)
        self.stdout.write(f"\nSummary after {elapsed:.1f}s: {len(scenario.tracked)} runs")
        for name, counter in by_class.items():
            self.stdout.write(f"  {name:<{width}}  {_counts(counter)}")
        stories = [t for t in scenario.tracked if t.story or t.expected != RunStatus.FINISHED]
        if stories:
            self.stdout.write("By design:")
            for tracked in stories:
                story = f" ({tracked.story})" if tracked.story else ""
                self.stdout.write(f"  {tracked.label}: {tracked.expected}{story}")
        self.stdout.write("What the steps did:")
        for line in facts():
            self.stdout.write(f"  {line}")
        wrong = [t for t in scenario.tracked if final.get(t.run_pk) != t.expected]
        for error in self.action_errors:
            self.stderr.write(self.style.ERROR(f"  the demo itself failed: {type(error).__name__}: {error}"))
        if self.action_errors and not wrong:
            raise CommandError(f"{len(self.action_errors)} demo action(s) failed.")
        if wrong:
            for tracked in wrong:
                self.stderr.write(
                    self.style.ERROR(
                        f"  {tracked.label} ({tracked.workflow_class}) is {final.get(tracked.run_pk, 'missing')}, "
                        f"designed to end {tracked.expected}"
                    )
                )
            raise CommandError(f"{len(wrong)} of {len(scenario.tracked)} runs did not end as designed.")
        total = Counter(final.values())
        self.stdout.write(self.style.SUCCESS(f"All {len(scenario.tracked)} runs ended as designed: {_counts(total)}."))
        self._admin_hint()

    def _admin_hint(self) -> None:
        self.stdout.write("\nOpen the admin to see each run's steps, events and signals:")
        venv = (Path(settings.BASE_DIR) / ".venv").resolve()
        if Path(sys.prefix).resolve() == venv and not os.environ.get("VIRTUAL_ENV"):
            self.stdout.write("  source .venv/bin/activate")
        self.stdout.write("  python manage.py createsuperuser")
        self.stdout.write("  python manage.py runserver")
        self.stdout.write("  then open http://127.0.0.1:8000/admin/")
        self.stdout.write(
            "The paused order waits for an operator: give it a postcode (Shop > Orders), resume its run\n"
            "(Workflows > Workflow runs, or `python manage.py workflows list --status paused`, then\n"
            "`python manage.py workflows resume RUN_ID`), and `python manage.py run_workflow_dispatcher` ships it."
        )


def _serve(dispatcher: WorkflowDispatcher, failure: list[BaseException]) -> None:
    try:
        dispatcher.run()
    except BaseException as error:  # reported by the main thread
        failure.append(error)
    finally:
        connection.close()


def run_counts(tracked: list[Tracked]) -> Counts:
    """``{(class, status): runs}`` over the demo's runs."""
    rows = (
        WorkflowRun.objects.filter(pk__in=[t.run_pk for t in tracked])
        .values_list("workflow_class", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return {(klass, status): n for klass, status, n in rows}


def settled(tracked: list[Tracked]) -> bool:
    """True when no run can move any more (finished, cancelled, paused) or it is where it should end."""
    now = statuses(tracked)
    return all(now.get(t.run_pk) in SETTLED or now.get(t.run_pk) == t.expected for t in tracked)


def statuses(tracked: list[Tracked]) -> dict[int, str]:
    """``{run pk: status}`` of the demo's runs."""
    return dict(WorkflowRun.objects.filter(pk__in=[t.run_pk for t in tracked]).values_list("pk", "status"))


def _counts(counter: Counter[str]) -> str:
    """``3 finished, 1 cancelled``: ends first, then the ongoing statuses."""
    order = ["finished", "cancelled", "paused", "waiting", "ready", "performing"]
    ranked = sorted(counter, key=lambda s: order.index(s) if s in order else len(order))
    return ", ".join(f"{counter[s]} {s}" for s in ranked)


class _Listening:
    """Feed lines from the library's signals and log while the demo runs."""

    def __init__(self, feed: Feed, scenario: Scenario) -> None:
        self.feed = feed
        self.scenario = scenario
        self.logger = logging.getLogger("pgbus_workflows")
        self.saved: tuple[int, bool] = (self.logger.level, self.logger.propagate)

    def label(self, workflow_id: Any) -> str:
        for tracked in self.scenario.tracked:
            if tracked.workflow_id == str(workflow_id):
                return tracked.label
        return str(workflow_id)

    def transitioned(self, sender: str, workflow_id: Any, to_status: str, **kwargs: Any) -> None:
        if to_status in SETTLED:
            self.feed.add(f"{self.label(workflow_id)}: {to_status}")

    def step_finished(self, sender: str, workflow_id: Any, step_name: str, attempt: int, **kwargs: Any) -> None:
        outcome, error = kwargs.get("outcome"), (kwargs.get("error_class") or "").rpartition(".")[2]
        if outcome == "reattempted" and error:
            self.feed.add(f"{self.label(workflow_id)}: {step_name} attempt {attempt} failed ({error}), reattempt later")
        elif outcome == "failed":
            self.feed.add(f"{self.label(workflow_id)}: {step_name} failed ({error})")
        elif outcome == "skipped":
            self.feed.add(f"{self.label(workflow_id)}: {step_name} skipped")

    def timed_out(self, sender: str, workflow_id: Any, step_name: str, action: str, **kwargs: Any) -> None:
        self.feed.add(f"{self.label(workflow_id)}: {step_name} wait timed out (on_timeout={action!r})")

    def __enter__(self) -> _Listening:
        signals.workflow_transitioned.connect(self.transitioned)
        signals.step_finished.connect(self.step_finished)
        signals.wait_timed_out.connect(self.timed_out)
        self.logger.addHandler(self.feed)
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        signals.workflow_transitioned.disconnect(self.transitioned)
        signals.step_finished.disconnect(self.step_finished)
        signals.wait_timed_out.disconnect(self.timed_out)
        self.logger.removeHandler(self.feed)
        self.logger.setLevel(self.saved[0])
        self.logger.propagate = self.saved[1]
