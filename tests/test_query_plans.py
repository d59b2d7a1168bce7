"""The hot queries use the indexes they were written for (EXPLAIN on the live schema).

With sequential and bitmap scans turned off, the planner shows whether an index *can* serve
the query: a change to its WHERE or ORDER BY that the partial index no longer matches shows
up here as a Sort or another index, long before it shows up as a slow claim in production.
A claim of its own is planned with bitmap scans off (``auto_explain`` shows what ran).
"""

import json

import pytest
from django.db import connection, transaction

from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps, claim_step
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.fanout import claim_due_jobs
from tests.testapp.workflows import Counted, Squares

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
    sql = claim_statement(lambda: claim_due_steps(10), "FOR UPDATE OF r, s")

    plan = plan_of(sql)
    kinds = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan)]
    assert ("Index Scan", "pgbus_wf_step_due") in kinds, json.dumps(plan, indent=1)
    assert "Sort" not in [kind for kind, _ in kinds], json.dumps(plan, indent=1)


def test_the_job_claim_query_walks_the_partial_due_jobs_index_in_order_without_sorting():
    wf = Squares.start(count=3)
    execute_step(claim_step(WorkflowStep.objects.get(run=wf.record).pk))
    sql = claim_statement(lambda: claim_due_jobs(10), "status = 'pending'")

    plan = plan_of(sql)
    kinds = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan)]
    assert ("Index Scan", "pgbus_wf_job_due") in kinds, json.dumps(plan, indent=1)
    assert "Sort" not in [kind for kind, _ in kinds], json.dumps(plan, indent=1)


@pytest.fixture
def executed_plans():
    """The plans of the statements the block executes on Django's connection (``auto_explain``, sent as notices)."""
    plans: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        cursor.execute("SET auto_explain.log_min_duration = 0")
        cursor.execute("SET auto_explain.log_level = 'notice'")
        cursor.execute("SET auto_explain.log_settings = on")  # the planner settings that differ from the defaults

    def handler(notice):
        plans.append(notice.message_primary)

    connection.connection.add_notice_handler(handler)
    try:
        yield plans
    finally:
        connection.connection.remove_notice_handler(handler)
        with connection.cursor() as cursor:
            cursor.execute("RESET auto_explain.log_min_duration")
            cursor.execute("RESET auto_explain.log_level")
            cursor.execute("RESET auto_explain.log_settings")


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
