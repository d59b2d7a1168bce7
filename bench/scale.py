"""Scale benchmark: the engine and the operator's pages behind 10,000,000 finished runs, against empty tables.

    .venv/bin/python -m bench.scale [--runs 10000000] [--waiting 1000000] [--days 10] [--repeat 3]
                                     [--samples 200] [--quick] [--keep]

Two databases of its own, side by side: ``<DATABASE_URL name>_bench`` with empty tables (a
few runs of interest only) and ``<DATABASE_URL name>_scale_bench`` with the same runs of
interest and ``--runs`` finished three-step runs (their attempts and events: copies of a run
the engine made, ``bench.scale_fill``), their ends spread over the last ``--days`` days, all
but five of one busy class, five of a quiet class in the last day; and ``--waiting`` runs
waiting three days and more for their next step; the history rolled up for insights as the
sweep would have (``services.rollups``). Then, alternating between the two
databases from one repetition to the next (so a slow minute of the machine touches both):

- backlog steps/s (``bench.dispatch``: 1,000 three-step runs started, then one dispatcher of
  four drains them);
- idle latency (``bench.trickle``'s: ``start()`` call to the body's first line, p50);

each paired by repetition, with the median of the ratios. Then each page an operator opens,
fetched through Django's test client as a superuser on each database: the median of
``--repeat`` fetches after one to warm up (and the metrics scrape, with the ``prometheus``
extra). The goals (issue #53): backlog >= 0.9x, idle p50 <= 1.1x, every page <= 500 ms.
Last, one sweep's retention cleanup deletes what it can in its five seconds (the runs older
than five days, as if 25 days had passed), and the rate is printed. ``--quick``: 200,000 runs
and 20,000 waiting (a smoke run, not figures to publish). ``--keep`` leaves the large
database for another look, without the cleanup (``--reuse`` measures it again without building:
migrated first, as a site upgrading would be, with the seconds printed, its rollups caught up and
its tables vacuumed and analysed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.admin import timed
from bench.common import BENCH_URL, admin_connection, psql_args, quantiles_ms
from bench.scale_fill import Copies, bulk_load, check_copies, copy_run

# Named ``..._bench`` so that the processes it starts (``bench.common`` in each) keep it.
SCALE_URL = BENCH_URL.removesuffix("_bench") + "_scale_bench"
#: Each page's goal, in milliseconds, whatever the history.
PAGE_GOAL_MS = 500.0
BUSY, QUIET = "scale_busy", "scale_quiet"


def use(url: str) -> None:
    """Point this process's Django connections, and the processes it starts, at ``url``'s database."""
    from django.db import connections

    connections.close_all()
    os.environ["DATABASE_URL"] = url
    connections["default"].settings_dict["NAME"] = psql_args(url)[1]


def create(url: str) -> None:
    """Drop and create ``url``'s database, migrate it, and give it the runs of interest and a superuser."""
    import django
    from django.core.management import call_command

    _, name = psql_args(url)
    django.setup()
    use(url)
    from django.db import connections

    connections.close_all()
    with admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")


def templates() -> dict[str, int]:
    """Runs the engine makes: a finished three-step run of each class, and a run waiting for its second step."""
    from pgbus_workflows.models import WorkflowRun
    from pgbus_workflows.testing import WorkflowTestMixin
    from tests.testapp.workflows import ThreeSteps, Waits

    helpers = WorkflowTestMixin()
    made = {}
    for name in (BUSY, QUIET):
        wf = helpers.speedrun_workflow(ThreeSteps.start())
        WorkflowRun.objects.filter(pk=wf.record.pk).update(workflow_class=name)
        made[name] = wf.record.pk
    waiting = Waits.start()
    helpers.perform_next_step(waiting)
    made["waiting"] = waiting.record.pk
    return made


def build(runs: int, waiting: int, days: float) -> float:
    """Fill the current database (see the module's docstring); returns seconds."""
    from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep

    began = time.perf_counter()
    made = templates()
    with bulk_load((WorkflowRun, WorkflowStep, WorkflowEvent)):
        copy_run(Copies(made[BUSY], runs - 5, BUSY, days * 86400))
        copy_run(Copies(made[QUIET], 5, QUIET, 86400))
        copy_run(Copies(made["waiting"], waiting, "waits", 86400, due_in_seconds=3 * 86400))
    for name, pk in made.items():
        check_copies(pk, "waits" if name == "waiting" else name)
    settle()
    return time.perf_counter() - began


def settle() -> None:
    """The history rolled up as the sweep would have, and the tables vacuumed and analysed as autovacuum would."""
    from django.db import connection

    from pgbus_workflows import models

    roll_up_history()
    rolled = (models.WorkflowStepHour, models.WorkflowStepSpan, models.WorkflowRunHour, models.WorkflowRunSpan)
    with connection.cursor() as cursor:  # autocommit: VACUUM cannot run in a transaction
        for model in (models.WorkflowRun, models.WorkflowStep, models.WorkflowEvent, *rolled):
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")


def migrate() -> float | None:
    """Apply the migrations the current database lacks (code newer than its build); their seconds, or None."""
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    if not executor.migration_plan(executor.loader.graph.leaf_nodes()):
        return None
    began = time.perf_counter()
    call_command("migrate", verbosity=0)
    return time.perf_counter() - began


def rolled_up_as_the_sweep_would_have() -> None:
    """The rollups brought up to a minute ago, as the sweep keeps them (a checkpoint, then its end)."""
    from pgbus_workflows.services import rollups
    from pgbus_workflows.sql import clock

    rollups.roll_up(clock.now())  # takes the checkpoint
    time.sleep(1)
    rollups.roll_up(clock.now())  # adds up to it, its transactions ended


def roll_up_history(within: float = 3600.0) -> None:
    """Roll the copied history up as the sweep would have (``services.rollups``), waiting at most ``within`` seconds."""
    from pgbus_workflows.services import periods, rollups
    from pgbus_workflows.services.run_hours import RUN_MARK
    from pgbus_workflows.sql import clock

    def behind() -> bool:  # either rollup (the attempts', the runs') short of the last whole hour
        marks = [rollups.rolled_until(mark) for mark in (rollups.MARK, RUN_MARK)]
        return any(until is None or until < periods.floor_hour(clock.now() - rollups.SETTLE) for until in marks)

    deadline = time.monotonic() + within
    rollups.roll_up(clock.now())  # the first checkpoints
    while behind():
        if time.monotonic() > deadline:  # a long transaction elsewhere on the server holds it back
            print("The rollups did not catch up: insights read attempts and runs past them.")
            return
        rollups.roll_up(clock.now(), max_seconds=within)
        time.sleep(0.1)


def pages() -> list[tuple[str, str]]:
    """(label, URL) of each page measured, on the current database."""
    from django.urls import reverse

    from pgbus_workflows.models import WorkflowRun

    def cl(model: str, query: str = "") -> str:
        return reverse(f"admin:pgbus_workflows_{model}_changelist") + query

    def insights(klass: str, window: str) -> tuple[str, str]:
        url = reverse("admin:pgbus_workflows_insights", args=[klass]) + f"?window={window}"
        return f"insights, {'busy' if klass == BUSY else 'quiet'} class, {window}", url

    run = WorkflowRun.objects.filter(workflow_class=BUSY).order_by("-pk").first()
    assert run is not None
    return [
        ("dashboard", reverse("admin:pgbus_workflows_workflowrun_dashboard")),
        ("runs", cl("workflowrun")),
        ("runs, busy class, finished", cl("workflowrun", f"?workflow_class={BUSY}&status=finished")),
        ("runs, waiting class, ready", cl("workflowrun", "?workflow_class=waits&status=ready")),
        ("a run page", reverse("admin:pgbus_workflows_workflowrun_change", args=[run.pk])),
        *(insights(klass, window) for klass in (BUSY, QUIET) for window in ("1h", "24h", "7d")),
        ("limiters", cl("workflowlimiter")),
        ("tasks", cl("djangotask")),
    ]


def page_times(repeat: int) -> dict[str, float]:
    """Each page's median milliseconds (and the metrics scrape's) on the current database."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))

    def fetch(url: str) -> None:
        status = client.get(url).status_code
        if status != 200:
            raise RuntimeError(f"{url} answered {status}")

    rolled_up_as_the_sweep_would_have()
    found = {label: timed(lambda url=url: fetch(url), repeat)[0] for label, url in pages()}  # type: ignore[misc]
    try:
        from django.test import RequestFactory

        from pgbus_workflows.metrics import metrics_view
    except ImportError:  # the prometheus extra is not installed
        return found
    request = RequestFactory().get("/metrics/")
    found["metrics scrape"] = timed(lambda: metrics_view(request), repeat)[0]
    return found


def paired(repeat: int, samples: int, runs: int) -> dict[str, tuple[list[float], list[float]]]:
    """Backlog steps/s and idle p50 ms on the empty database and the large one, alternating by repetition."""
    from bench.dispatch import throughput
    from bench.trickle import latency_report

    found: dict[str, tuple[list[float], list[float]]] = {"backlog": ([], []), "idle p50": ([], [])}
    for repetition in range(repeat):
        for large in (False, True) if repetition % 2 == 0 else (True, False):
            use(SCALE_URL if large else BENCH_URL)
            found["backlog"][large].append(throughput(runs, 1, 4))
            found["idle p50"][large].append(quantiles_ms(latency_report(samples)["latency"], 50)[0])
    return found


def main() -> None:
    """Build, measure and print the tables (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000_000)
    parser.add_argument("--waiting", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=10.0, help="the finished runs' ends spread over these days")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=200, help="idle latency samples per database and repetition")
    parser.add_argument("--quick", action="store_true", help="200,000 runs, 20,000 waiting, one repetition")
    parser.add_argument("--keep", action="store_true", help="leave the large database")
    parser.add_argument("--reuse", action="store_true", help="measure the large database left by --keep")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.waiting, args.repeat, args.samples = 200_000, 20_000, 1, 50

    create(BENCH_URL)
    templates()
    seconds = None
    if not args.reuse:
        create(SCALE_URL)
        seconds = build(args.runs, args.waiting, args.days)
    else:  # upgraded as a site would be, and rolled up as the sweep would have gone on doing
        use(SCALE_URL)
        migrated = migrate()
        if migrated is not None:
            print(f"Migrated the large database in {migrated:.1f} s.")
        settle()
    try:
        series = paired(args.repeat, args.samples, 1000)
        use(BENCH_URL)
        empty = page_times(args.repeat)
        use(SCALE_URL)
        large = page_times(args.repeat)
        sizes = table_sizes()
        deleted = None if args.keep else retention_rate()
    finally:
        from django.db import connections

        connections.close_all()
        with admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{psql_args(BENCH_URL)[1]}" WITH (FORCE)')
            if not args.keep:
                conn.execute(f'DROP DATABASE IF EXISTS "{psql_args(SCALE_URL)[1]}" WITH (FORCE)')
    built = f", built in {seconds:.0f} s" if seconds is not None else ""
    print(f"{args.runs:,} finished runs over {args.days:g} days and {args.waiting:,} waiting{built}; {sizes}.")
    print()
    print_paired_rows(series)
    print()
    print_pages(empty, large, args.runs)
    if deleted is not None:
        print()
        print(f"One sweep's retention cleanup among them: {deleted:,.0f} runs deleted a second.")


def retention_rate() -> float:
    """Runs a second that one sweep's cleanup deletes on the large database (its runs older than 5 days)."""
    from datetime import timedelta

    from pgbus_workflows.dispatcher.sweep import CLEANUP_SECONDS
    from pgbus_workflows.services.retention import delete_expired_runs
    from pgbus_workflows.sql import clock

    later = clock.now() + timedelta(days=25)  # RETENTION is 30 days: as if 25 days had passed
    began = time.perf_counter()
    deleted = delete_expired_runs(later, max_seconds=CLEANUP_SECONDS)
    return deleted / (time.perf_counter() - began)


def table_sizes() -> str:
    """The large database's tables and indexes, in GB, for the page's reader."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return f"{cursor.fetchone()[0] / 1e9:.1f} GB on disk"


def print_paired_rows(series: dict[str, tuple[list[float], list[float]]]) -> None:
    """The paired measurements: each repetition, and the median of the paired ratios against the goal."""
    print("| measurement | empty tables | large tables | ratio, paired (median) | goal |")
    print("|---|---|---|---:|---|")
    goals = {"backlog": ">= 0.9", "idle p50": "<= 1.1"}
    for name, (empty, large) in series.items():
        ratios = [b / a for a, b in zip(empty, large, strict=True)]
        shown = " / ".join
        figure = "{:,.0f}" if name == "backlog" else "{:.1f}"
        unit = "steps/s" if name == "backlog" else "ms"
        print(
            f"| {name} ({unit}) | {shown(figure.format(v) for v in empty)} | {shown(figure.format(v) for v in large)} "
            f"| {statistics.median(ratios):.2f} | {goals[name]} |"
        )


def print_pages(empty: dict[str, float], large: dict[str, float], runs: int) -> None:
    """Each page's median milliseconds on both databases, against the 500 ms goal."""
    print(f"| page | empty tables, ms | {runs:,} runs, ms | within {PAGE_GOAL_MS:.0f} ms |")
    print("|---|---:|---:|---|")
    for label, ms in large.items():
        print(f"| {label} | {empty[label]:.1f} | {ms:.1f} | {'yes' if ms <= PAGE_GOAL_MS else 'no'} |")


if __name__ == "__main__":
    main()
