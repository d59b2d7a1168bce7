"""The hot queries use the indexes they were written for (EXPLAIN on the live schema).

With sequential and bitmap scans turned off, the planner shows whether an index *can* serve
the query: a change to its WHERE or ORDER BY that the partial index no longer matches shows
up here as a Sort or another index, long before it shows up as a slow claim in production.
A claim of its own is planned with bitmap scans off (``auto_explain`` shows what ran).

A dispatcher's connections live for days and keep each prepared statement's plan. A plan made
while the tables were small (a new install, or autovacuum off or behind, as on this machine's
PostgreSQL) reads a whole table for what an index finds in a few pages, and goes on doing so
as the table grows, until an ANALYZE of it happens to invalidate the plan: the claim and the
outcome's transaction are planned without sequential scans too.
"""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from psycopg import sql as psql

from pgbus_workflows import sql
from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.services.applying import apply_outcomes
from pgbus_workflows.services.chain import Chain
from pgbus_workflows.services.claims import claim_and_look_ahead, claim_due_steps, claim_step, still_in_progress
from pgbus_workflows.services.executor import execute_step, perform_step
from pgbus_workflows.services.fanout import claim_due_jobs
from pgbus_workflows.sql import clock
from tests.testapp.workflows import Counted, NoOp3, Squares

pytestmark = pytest.mark.django_db


def plan_of(statement: tuple[str, list]) -> dict:
    text, params = statement
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN (FORMAT JSON) " + text, params)
        return cursor.fetchone()[0][0]["Plan"]


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def claim_statement(claim, marker: str) -> tuple[str, list]:
    """The claim's own statement and its parameters, as sent (pipelined ones too)."""
    seen = []

    def record(execute, text, params, many, context):
        seen.append((text, params))
        return execute(text, params, many, context)

    with connection.execute_wrapper(record):
        claim()
    return next((text, params) for text, params in seen if marker in text and "SKIP LOCKED" in text)


def test_the_claim_query_walks_the_partial_due_index_in_order_without_sorting():
    Counted.start()
    statement = claim_statement(lambda: claim_due_steps(10), "AS step_key")

    plan = plan_of(statement)
    kinds = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan)]
    assert ("Index Scan", "pgbus_wf_step_due") in kinds, json.dumps(plan, indent=1)
    sorts = [n for n in nodes(plan) if n["Node Type"] == "Sort"]
    # The claimed steps of each key are ranked (a sort of the claim's few rows), never the due index's walk.
    for sort in sorts:
        below = [(n["Node Type"], n.get("Index Name")) for n in nodes(sort)]
        assert ("Index Scan", "pgbus_wf_step_due") not in below, json.dumps(plan, indent=1)


def test_the_job_claim_query_walks_the_partial_due_jobs_index_in_order_without_sorting():
    wf = Squares.start(count=3)
    execute_step(claim_step(WorkflowStep.objects.get(run=wf.record).pk))
    statement = claim_statement(lambda: claim_due_jobs(10), "status = 'pending'")

    plan = plan_of(statement)
    kinds = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan)]
    assert ("Index Scan", "pgbus_wf_job_due") in kinds, json.dumps(plan, indent=1)
    assert "Sort" not in [kind for kind, _ in kinds], json.dumps(plan, indent=1)


@pytest.mark.parametrize(
    ("text", "index"),
    [
        # ON DELETE of a step (retention): its events go with it.
        ('DELETE FROM "pgbus_workflows_workflowevent" WHERE "step_id" = %s', "pgbus_wf_event_step"),
        # ON DELETE of a signal: the attempt that received it keeps its place, without it.
        ('UPDATE "pgbus_workflows_workflowstep" SET "signal_id" = NULL WHERE "signal_id" = %s', "pgbus_wf_step_signal"),
    ],
)
def test_what_on_delete_looks_up_by_a_nullable_key_is_served_by_its_partial_index(text, index):
    # The two indexes leave out the NULLs (most attempts receive no signal, a run's own events
    # have no step): each write of such a row makes one index entry less.
    kinds = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan_of((text, [1])))]
    assert ("Index Scan", index) in kinds, kinds


@pytest.mark.django_db(transaction=True)
def test_a_claim_of_its_own_is_planned_without_bitmap_scans_and_one_in_the_callers_transaction_as_it_comes(
    executed_plans,
):
    # A bitmap scan of the due index (the planner's pick when it expects few due steps) reads
    # every entry the vacuum has not removed yet on every claim; an index scan stops at the limit.
    first, second = Counted.start(), Counted.start()

    (claimed,) = claim_due_steps(1, claimed_by="here")

    (plan,) = [p for p in executed_plans if "CTE due" in p]
    assert "enable_bitmapscan = 'off'" in plan and "Bitmap" not in plan, plan
    assert "Index Scan using pgbus_wf_step_due" in plan, plan
    assert claimed.run_id == first.record.pk and claimed.claimed_by == "here"
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_bitmapscan")
        assert cursor.fetchone()[0] == "on"  # the claim's transaction's own setting
    executed_plans.clear()

    with transaction.atomic():
        (claimed,) = claim_due_steps(1, claimed_by="here")
        with connection.cursor() as cursor:
            cursor.execute("SHOW enable_bitmapscan")
            assert cursor.fetchone()[0] == "on"  # the caller's transaction is left as it was

    (plan,) = [p for p in executed_plans if "CTE due" in p]
    assert "enable_bitmapscan" not in plan, plan
    assert claimed.run_id == second.record.pk


@pytest.mark.django_db(transaction=True)
def test_a_job_claim_of_its_own_is_planned_without_bitmap_scans(executed_plans):
    wf = Squares.start(count=3)
    execute_step(claim_step(WorkflowStep.objects.get(run=wf.record).pk))
    executed_plans.clear()

    jobs = claim_due_jobs(2)

    (plan,) = [p for p in executed_plans if "pgbus_wf_job_due" in p and "LockRows" in p]
    assert "enable_bitmapscan = 'off'" in plan and "Bitmap" not in plan, plan
    assert len(jobs) == 2
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_bitmapscan")
        assert cursor.fetchone()[0] == "on"  # the claim's transaction's own setting
    executed_plans.clear()

    with transaction.atomic():
        (job,) = claim_due_jobs(2)

    (plan,) = [p for p in executed_plans if "pgbus_wf_job_due" in p and "LockRows" in p]
    assert "enable_bitmapscan" not in plan, plan  # the caller's transaction is left as it was
    assert job.pk not in {j.pk for j in jobs}


TABLES = (WorkflowRun._meta.db_table, WorkflowStep._meta.db_table)


def start_elsewhere(runs: int) -> None:
    """Start ``runs`` runs on another connection, as a web process would (its session plans its own statements)."""

    def start() -> None:
        try:
            NoOp3.start_many([{} for _ in range(runs)])
        finally:
            connection.close()

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()


def run_steps_as_a_worker() -> int:
    """A worker's path one step at a time: a claim, the body, the outcome (which claims the run's next step)."""
    chain, ran = Chain("test"), 0
    while claimed := claim_and_look_ahead(1, claimed_by="test")[0]:
        while claimed:
            done = perform_step(claimed[0], chain=chain, verify=False)
            apply_outcomes([done] if isinstance(done, tuple) else [], chain)
            ran += 1
            claimed = chain.take()
    return ran


@pytest.mark.django_db(transaction=True)
def test_claims_and_outcomes_read_runs_and_steps_by_index_when_the_tables_looked_empty(monkeypatch, executed_plans):
    monkeypatch.setattr(sql, "_prepared_at", set())
    connection.ensure_connection()
    sql.prepare_statements(connection.connection)  # plans cached for the connection, as a dispatcher's are
    with connection.cursor() as cursor:
        for name in TABLES:  # the statistics of empty tables: a whole-table read looks free
            cursor.execute(psql.SQL("ANALYZE {}").format(psql.Identifier(name)).as_string(None))
    start_elsewhere(40)
    executed_plans.clear()

    assert run_steps_as_a_worker() == 120  # past the five runs after which a prepared statement's plan is kept

    claims = [plan for plan in executed_plans if "CTE due" in plan]
    locks = [plan for plan in executed_plans if "LockRows" in plan and "CTE due" not in plan]
    assert len(claims) == 41 and locks, executed_plans[:3]  # a claim per run, and the last one finding none
    whole_tables = [plan for plan in executed_plans if any(f"Seq Scan on {table}" in plan for table in TABLES)]
    assert whole_tables == []
    assert WorkflowRun.objects.filter(status="finished").count() == 40
    assert setting("enable_seqscan") == "on"  # each transaction's own setting


@pytest.mark.django_db(transaction=True)
def test_a_workers_statements_are_never_jit_compiled_and_its_claims_keep_their_generic_plan(
    monkeypatch, executed_plans
):
    # Behind many steps waiting for later, a claim's estimate grew past jit_above_cost (25 ms
    # compiling a claim that ran in 1 ms), and PostgreSQL planned each prepared claim anew
    # (1.5 ms a claim): both settings are its transaction's own, sent with the statement.
    monkeypatch.setattr(sql, "_prepared_at", set())
    connection.ensure_connection()
    sql.prepare_statements(connection.connection)
    start_elsewhere(8)
    executed_plans.clear()

    assert run_steps_as_a_worker() == 24

    claims = [plan for plan in executed_plans if "CTE due" in plan]
    outcomes = [plan for plan in executed_plans if "Query Text: WITH p AS" in plan]  # the outcome's lock
    assert len(claims) == 9 and outcomes, executed_plans[:3]
    assert all("jit = 'off'" in plan and "plan_cache_mode = 'force_generic_plan'" in plan for plan in claims)
    assert all("jit = 'off'" in plan and "plan_cache_mode" not in plan for plan in outcomes), outcomes[0]
    assert (setting("jit"), setting("plan_cache_mode")) == ("on", "auto")  # nothing left on the session


def setting(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(psql.SQL("SHOW {}").format(psql.Identifier(name)).as_string(None))
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_an_outcome_applied_inside_the_callers_transaction_leaves_its_planner_settings_alone():
    wf = Counted.start()
    with transaction.atomic():
        execute_step(claim_step(WorkflowStep.objects.get(run=wf.record).pk))
        assert (setting("enable_seqscan"), setting("enable_bitmapscan")) == ("on", "on")
    assert WorkflowStep.objects.filter(run=wf.record, status="completed").count() == 1


def emptied_and_analysed_then_filled(runs: int) -> None:
    """Tables whose statistics say they are nearly empty, holding ``runs`` new runs.

    Emptied, then analysed (as a VACUUM does too): one row counted over the pages that held
    300 runs. The tables then fill again before the next ANALYZE (autovacuum's comes up to a
    minute later, or never where it is off), and the planner, taking the density it knows,
    expects a row or so of each: every index looks as cheap as any, a whole one included.
    """
    start_elsewhere(300)
    kept = WorkflowRun.objects.order_by("pk").last()
    WorkflowRun.objects.exclude(pk=kept.pk).delete()
    with connection.cursor() as cursor:
        for name in TABLES:
            cursor.execute(psql.SQL("ANALYZE {}").format(psql.Identifier(name)).as_string(None))
    start_elsewhere(runs)


def scans_of_tables(plan: dict) -> list[dict]:
    """The plan's nodes that read the runs or the steps (not the writes themselves)."""
    return [n for n in nodes(plan) if n.get("Relation Name") in TABLES and n["Node Type"] != "ModifyTable"]


#: Partial indexes of the steps not finished yet alone (scheduled, in progress, waiting): walking
#: one reads the work at hand, never the history of finished steps.
LIVE_STEPS = ("pgbus_wf_step_due", "pgbus_wf_step_in_progress", "pgbus_wf_one_active_step_per_run")


def reads_growing_with_history(plan: dict) -> list[dict]:
    """Reads of the runs or steps with no index condition, but for a walk of a partial index of live steps.

    The look-ahead (the earliest step due later) walks the steps still scheduled, and the
    re-check of queued claims may walk those in progress: with the statistics of nearly empty
    tables, such a walk looks as cheap as the keys.
    """
    return [n for n in scans_of_tables(plan) if "Index Cond" not in n and n.get("Index Name") not in LIVE_STEPS]


@pytest.mark.django_db(transaction=True)
def test_a_claim_reads_each_run_by_its_key_when_the_statistics_say_the_tables_are_nearly_empty():
    # The claim's plain join read all the runs for each due step, and its look-ahead for each
    # step due later: about 0.7 s a claim with 3,000 runs (measured, docs/dispatcher.md).
    emptied_and_analysed_then_filled(600)
    later = WorkflowStep.objects.filter(status="scheduled").order_by("-pk")[:100]
    WorkflowStep.objects.filter(pk__in=list(later.values_list("pk", flat=True))).update(
        scheduled_at=clock.now() + timedelta(hours=1)  # due later, as after a wait or a backoff
    )

    with transaction.atomic():
        plan = plan_of(claim_statement(lambda: claim_and_look_ahead(10, claimed_by="test"), "AS step_key"))

    scans = scans_of_tables(plan)
    runs = [n for n in scans if n["Relation Name"] == WorkflowRun._meta.db_table]
    assert len(runs) == 3, json.dumps(plan, indent=1)  # the due steps' runs, the claimed ones moved, the look-ahead's
    assert all(n.get("Index Name") == "pgbus_workflows_workflowrun_pkey" for n in runs), json.dumps(runs, indent=1)
    assert reads_growing_with_history(plan) == [], json.dumps(scans, indent=1)


@pytest.mark.django_db(transaction=True)
def test_a_workers_statements_find_rows_by_their_keys_when_the_statistics_say_the_tables_are_nearly_empty(
    monkeypatch, executed_plans
):
    # The outcome's lock of the runs' steps read a whole index of the steps to join them to
    # their runs, its update of the steps the whole primary key, and the re-check of queued
    # claims, planned once while the table was small, the whole table: each grew with the table.
    monkeypatch.setattr(sql, "_prepared_at", set())
    connection.ensure_connection()
    sql.prepare_statements(connection.connection)  # plans kept for the connection, as a dispatcher's are
    emptied_and_analysed_then_filled(40)
    with connection.cursor() as cursor:
        cursor.execute("SET auto_explain.log_format = 'json'")
    executed_plans.clear()

    assert run_steps_as_a_worker() == 123  # the 40 and the run kept: past the five after which a plan is kept
    start_elsewhere(12)
    rechecked = [still_in_progress([step.pk for step in claim_due_steps(2, claimed_by="test")]) for _ in range(6)]

    plans = [json.loads(text[text.index("{") :])["Plan"] for text in executed_plans]
    assert len(plans) > 120 and all(len(alive) == 2 for alive in rechecked), executed_plans[:3]
    whole = [scan for plan in plans for scan in reads_growing_with_history(plan)]
    assert whole == [], json.dumps(whole, indent=1)
