"""Admin benchmark: each admin page's time and query count with a million runs of history.

    .venv/bin/python -m bench.admin [--runs 1000000] [--repeat 5] [--quick]

In a database of its own (``<DATABASE_URL name>_bench``, created and dropped here): a few
runs of interest made by the engine (one paused on error, one waiting for a signal, one
due, one failed fan-out job) and ``BASELINE_RUNS`` runs of history, so that every list has
a full page; every page is fetched through Django's test client as a superuser on that
small database (the baseline); then the rest of the history is written in SQL
(``generate_series``: ``--runs`` finished runs in all, three completed attempts and ten
events each, a consumed signal each, a fan-out job for one run in three, spread over the
last year), vacuumed and analyzed, and every page is fetched again. Each time is the median
of ``--repeat`` fetches after one to warm up; the ratio is the large database's time over
the small one's. The time spent in SQL (each query from send to result, fetched rows included) is
given apart: it is what the history could make grow; the rest is Python rendering the page.
A primary-key lookup of a run is measured the same way, for scale. ``--quick``: 20,000
runs (a smoke run, not figures to publish). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.common import drop_database, recreate_database

#: Runs of history in the baseline database: a full page of every list, and 100 pages of runs.
BASELINE_RUNS = 5_100
#: Ten events per run: three attempts started and completed, the run finished, and the
#: routine kinds between them; one run in a thousand was paused and resumed by an operator.
EVENT_KINDS = (
    "step_started",
    "step_completed",
    "step_started",
    "step_completed",
    "step_started",
    "step_waiting",
    "step_woken",
    "step_completed",
    "finished",
    "step_resolved",
)


def fill_history(first: int, last: int, total: int) -> float:
    """Write finished runs ``first``..``last`` (of ``total``, spread over a year) with their attempts,
    events, signals and jobs, then vacuum and analyze; returns seconds."""
    from django.db import connection

    from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep

    run, step, event, signal, job = (
        m._meta.db_table for m in (WorkflowRun, WorkflowStep, WorkflowEvent, WorkflowSignal, FanOutJob)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {run}")
        runs_before = cursor.fetchone()[0]
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {step}")
        steps_before = cursor.fetchone()[0]
    params = {"first": first, "last": last, "total": total, "kinds": list(EVENT_KINDS)}
    params |= {"runs_before": runs_before, "steps_before": steps_before}
    new_runs = "r.id > %(runs_before)s AND r.workflow_class LIKE 'history%%'"
    statements = [
        f"""INSERT INTO {run} (workflow_id, workflow_class, status, current_step, arguments, allow_multiple,
              paused_reason, created_at, started_at, finished_at, status_changed_at, subject_type, subject_id,
              idempotency_key)
            SELECT gen_random_uuid(), 'history_' || (n %% 5), 'finished', 'c', '{{}}', false, '', at, at, at, at,
                   'testapp.order', 'h' || n, 'key-' || n
            FROM generate_series(%(first)s, %(last)s) AS n,
                 LATERAL (SELECT now() - interval '365 days' * n / %(total)s AS at) t""",
        f"""INSERT INTO {step} (run_id, step_name, attempt, status, outcome, reattempt_reason, queue, priority,
              scheduled_at, started_at, finished_at, claimed_by, error_class, error_message, traceback, timed_out,
              created_at)
            SELECT r.id, s.name, 1, 'completed', 'success', '', 'workflows', 0, r.created_at, r.created_at,
                   r.created_at, '', '', '', '', false, r.created_at
            FROM {run} r CROSS JOIN (VALUES ('a'), ('b'), ('c')) AS s(name) WHERE {new_runs}""",
        f"""INSERT INTO {event} (run_id, kind, transition, from_status, to_status, actor, reason, details, created_at)
            SELECT r.id, CASE WHEN r.id %% 1000 = 0 AND g < 3 THEN (ARRAY['paused', 'resumed'])[g]
                              ELSE (%(kinds)s::text[])[g] END,
                   '', '', '', CASE WHEN r.id %% 1000 = 0 AND g < 3 THEN 'alice' ELSE '' END, '', '{{}}', r.created_at
            FROM {run} r CROSS JOIN generate_series(1, 10) AS g WHERE {new_runs}""",
        f"""INSERT INTO {signal} (run_id, name, payload, status, actor, reason, received_at)
            SELECT r.id, 'approved', '{{}}', 'consumed', 'webhook', '', r.created_at FROM {run} r WHERE {new_runs}""",
        f"""INSERT INTO {job} (step_id, run_id, index, function, arguments, status, attempts, max_attempts, stalls,
              queue, priority, scheduled_at, finished_at, claimed_by, error)
            SELECT s.id, s.run_id, 0, 'tests.testapp.jobs.square', '{{}}', 'succeeded', 1, 1, 0, 'workflows', 0,
                   s.created_at, s.created_at, '', ''
            FROM {step} s WHERE s.id > %(steps_before)s AND s.step_name = 'c' AND s.run_id %% 3 = 0""",
    ]
    began = time.perf_counter()
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement, params)
    with connection.cursor() as cursor:  # autocommit: VACUUM cannot run in a transaction
        for table in (run, step, event, signal, job):
            cursor.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - began


def runs_of_interest() -> dict[str, Any]:
    """A run paused on error, one waiting for a signal, one due, and a fan-out with a failed job."""
    from pgbus_workflows.models import FanOutJob, WorkflowStep
    from pgbus_workflows.testing import WorkflowTestMixin
    from tests.testapp.models import Order
    from tests.testapp.workflows import Approval, FailsFirst, Squares, ThreeSteps

    helpers = WorkflowTestMixin()
    paused = FailsFirst.start(Order.objects.create())
    helpers.perform_next_step(paused)
    parked = Approval.start()
    helpers.perform_next_step(parked)
    ThreeSteps.start()
    fan = Squares.start(count=3)
    helpers.perform_next_step(fan)
    step = WorkflowStep.objects.filter(run=fan.record).order_by("-pk").first()
    assert step is not None
    FanOutJob.objects.filter(step=step, index=0).update(status="failed", error="bench")
    return {"paused": paused.record, "step": step}


def pages(interest: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, URL) of every page measured."""
    from django.urls import reverse

    def cl(model: str, query: str = "") -> str:
        return reverse(f"admin:pgbus_workflows_{model}_changelist") + query

    def insights(workflow_class: str, query: str) -> str:
        return reverse("admin:pgbus_workflows_insights", args=[workflow_class]) + query

    paused = interest["paused"]
    prefix = str(paused.workflow_id)[:8]
    return [
        ("runs", cl("workflowrun")),
        ("runs, page 100 (the deepest)", cl("workflowrun", "?p=100")),
        ("runs, one class", cl("workflowrun", "?workflow_class=history_1")),
        ("runs, paused", cl("workflowrun", "?status=paused")),
        ("runs, stuck: paused on error", cl("workflowrun", "?stuck=paused_on_error")),
        ("runs, search an id's first 8 digits", cl("workflowrun", f"?q={prefix}")),
        ("runs, search an idempotency key", cl("workflowrun", "?q=key-77")),
        ("steps", cl("workflowstep")),
        ("steps, failed", cl("workflowstep", "?status__exact=failed")),
        ("steps, finished in the last hour", cl("workflowstep", "?finished_within=1h")),
        ("steps of one run", cl("workflowstep", f"?run__id__exact={paused.pk}")),
        ("events", cl("workflowevent")),
        ("events, paused", cl("workflowevent", "?kind=paused")),
        ("signals", cl("workflowsignal")),
        ("signals, pending", cl("workflowsignal", "?status__exact=pending")),
        ("fan-out jobs", cl("fanoutjob")),
        ("fan-out jobs, failed", cl("fanoutjob", "?status__exact=failed")),
        ("dispatchers", cl("dispatcher")),
        ("schedules", cl("workflowschedule")),
        ("dashboard", reverse("admin:pgbus_workflows_workflowrun_dashboard")),
        ("insights, a class of history, 24h", insights("history_1", "?window=24h")),
        ("insights, a class of history, 7d", insights("history_1", "?window=7d")),
        ("insights, a class with ongoing runs", insights(paused.workflow_class, "")),
    ]


def clocked(spent: list[float], execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    """An execute wrapper: each query's seconds, from sending it to its rows fetched, into ``spent``."""
    began = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        spent.append(time.perf_counter() - began)


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, float, int]:
    """(median milliseconds, median milliseconds in SQL, queries) of ``call()``, after one call to warm up."""
    from django.db import connection

    call()
    seconds, in_sql, queries = [], [], 0
    for _ in range(repeat):
        spent: list[float] = []
        with connection.execute_wrapper(partial(clocked, spent)):
            began = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - began)
        in_sql.append(sum(spent))
        queries = len(spent)
    return statistics.median(seconds) * 1000, statistics.median(in_sql) * 1000, queries


def measure(client: Any, urls: list[tuple[str, str]], repeat: int) -> dict[str, tuple[float, float, int]]:
    """Each page's (median ms, median ms in SQL, queries); a page that does not answer 200 stops the benchmark."""

    def fetch(url: str) -> None:
        status = client.get(url).status_code
        if status != 200:
            raise RuntimeError(f"{url} answered {status}")

    return {label: timed(lambda url=url: fetch(url), repeat) for label, url in urls}  # type: ignore[misc]


def pk_lookup(pk: int, repeat: int) -> tuple[float, float, int]:
    """A run read by primary key: the scale every page is compared with."""
    from pgbus_workflows.models import WorkflowRun

    return timed(lambda: WorkflowRun.objects.get(pk=pk), repeat)


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="20,000 runs")
    args = parser.parse_args()
    runs = 20_000 if args.quick else args.runs

    recreate_database()
    try:
        from django.contrib.auth import get_user_model
        from django.test import Client

        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
        client = Client()
        client.force_login(user)
        interest = runs_of_interest()
        urls = pages(interest)
        fill_history(1, BASELINE_RUNS, runs)
        empty = measure(client, urls, args.repeat)
        empty_pk = pk_lookup(interest["paused"].pk, args.repeat)
        filled = fill_history(BASELINE_RUNS + 1, runs, runs)
        full = measure(client, urls, args.repeat)
        full_pk = pk_lookup(interest["paused"].pk, args.repeat)
    finally:
        drop_database()
    print(f"History: {runs:,} runs, {3 * runs:,} steps, {10 * runs:,} events, written in {filled:.0f} s.")
    print()
    print(f"| page | {BASELINE_RUNS:,} runs, ms | {runs:,} runs, ms | ratio | of which SQL, ms | queries |")
    print("|---|---|---|---|---|---|")
    rows = [("a run by primary key (the ORM, no page)", empty_pk, full_pk)]
    rows += [(label, empty[label], full[label]) for label, _url in urls]
    for label, before, after in rows:
        print(
            f"| {label} | {before[0]:.1f} | {after[0]:.1f} | {after[0] / before[0]:.2f} | "
            f"{before[1]:.1f} → {after[1]:.1f} | {after[2]} |"
        )


if __name__ == "__main__":
    main()
