"""The hot queries use the indexes they were written for (EXPLAIN on the live schema).

With sequential and bitmap scans turned off, the planner shows whether an index *can* serve
the query: a change to its WHERE or ORDER BY that the partial index no longer matches shows
up here as a Sort or another index, long before it shows up as a slow claim in production.
"""

import json

import pytest
from django.db import connection

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
