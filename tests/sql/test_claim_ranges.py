"""The claim reads one range of the due index per priority: lowest first, and never the steps waiting for later.

The due index (priority, ``scheduled_at``, id) holds every scheduled step, those due days from
now included (a drip campaign's waits). PostgreSQL bounds a read of it by ``scheduled_at`` only
within one priority, so the claim and its look-ahead find the priorities first (one descent
of the index each) and read each one's range. Read whole, the index cost a claim 0.6 s behind
200,000 runs waiting days (docs/dispatcher.md, docs/benchmarks.md).
"""

from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction

from pgbus_workflows.models import FanOutJob, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_and_look_ahead, claim_due_steps, claim_step
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.fanout import claim_due_jobs
from pgbus_workflows.sql import clock
from pgbus_workflows.sql.session import connection_params
from tests.sql.test_query_plans import claim_statement
from tests.testapp.workflows import NoOp3, Squares

pytestmark = pytest.mark.django_db(transaction=True)


def scheduled(priorities_and_ages: list[tuple[int, float]]) -> list[int]:
    """A NoOp3 run each, its first step at that priority, due that many seconds ago (negative: later); their keys."""
    NoOp3.start_many([{} for _ in priorities_and_ages])
    keys = list(WorkflowStep.objects.filter(status="scheduled").order_by("pk").values_list("pk", flat=True))
    now = clock.now()
    for key, (priority, age) in zip(keys, priorities_and_ages, strict=True):
        WorkflowStep.objects.filter(pk=key).update(priority=priority, scheduled_at=now - timedelta(seconds=age))
    return keys


def test_a_claim_takes_the_lowest_priority_first_then_the_longest_due():
    keys = scheduled([(5, 30), (-3, 10), (0, 20), (5, 40), (0, 50), (-3, 5), (2, -3600)])

    first = claim_due_steps(3, claimed_by="d")
    second = claim_due_steps(3, claimed_by="d")
    third = claim_due_steps(3, claimed_by="d")

    assert [s.pk for s in first] == [keys[1], keys[5], keys[4]]  # both of -3 (longest due first), then 0's
    assert [s.pk for s in second] == [keys[2], keys[3], keys[0]]  # the other of 0, then both of 5
    assert third == []  # priority 2's step is due in an hour
    assert WorkflowStep.objects.get(pk=keys[6]).status == "scheduled"


def test_a_claim_locks_no_step_nor_run_beyond_those_it_takes():
    # Each priority's range is read only while the claim still needs steps: a lock taken in a
    # range the limit did not reach would make another dispatcher's SKIP LOCKED pass over a
    # step that nobody claims, with no NOTIFY to come for it.
    keys = scheduled([(0, 10), (1, 10), (2, 10), (3, 10)])
    with transaction.atomic():
        (claimed,) = claim_due_steps(1, claimed_by="d")
        others = [key for key in keys if key != claimed.pk]
        with psycopg.connect(**connection_params(), autocommit=True) as conn, conn.transaction():
            steps = conn.execute(
                f"SELECT id, run_id FROM {WorkflowStep._meta.db_table} WHERE id = ANY(%s) FOR UPDATE NOWAIT", [others]
            ).fetchall()
            runs = conn.execute(
                f"SELECT id FROM {WorkflowRun._meta.db_table} WHERE id = ANY(%s) FOR UPDATE NOWAIT",
                [[run for _, run in steps]],
            ).fetchall()
    assert claimed.pk == keys[0]
    assert sorted(key for key, _ in steps) == others and len(runs) == 3


def test_the_look_ahead_is_the_earliest_step_due_later_of_a_ready_run_in_any_priority():
    keys = scheduled([(0, -60), (7, -30), (-1, -90), (3, -10)])
    paused = WorkflowStep.objects.get(pk=keys[3]).run_id
    WorkflowRun.objects.filter(pk=paused).update(status="paused")  # its step, the earliest, is not the loop's
    at = WorkflowStep.objects.get(pk=keys[1]).scheduled_at

    steps, ahead = claim_and_look_ahead(4, claimed_by="d")

    assert steps == [] and ahead.next_due_at == at


def pages_read(claim, marker: str) -> int:
    """The pages the claim's statement reads (``EXPLAIN ANALYZE``, planned as a claim is); nothing it does is kept."""
    with transaction.atomic():
        with transaction.atomic():
            text, params = claim_statement(claim, marker)
            transaction.set_rollback(True)
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute("SET LOCAL jit = off")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, params)
            plan = cursor.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


def vacuum(model) -> None:
    """Their entries as due now are gone, as after a wait written when the step was scheduled."""
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {model._meta.db_table}")


def settle(*models) -> None:
    """Vacuum each table: both measurements read indexes without dead entries."""
    for model in models:
        vacuum(model)


# Twenty thousand entries fill about 60 pages of an index; each of the claim's few descents
# of one grown a level deeper reads a page more. The claims that read these indexes whole
# read about 60,000 pages behind the runs (the look-ahead fetched each step and its run). The
# bound leaves room for what a loaded machine adds (once 40 and 61 pages where a quiet one reads
# 11 and 17) and is still a thousandth of what the whole-index read costs.
MORE_PAGES = 60


def test_a_claim_reads_no_more_with_twenty_thousand_runs_waiting_days_for_their_next_step():
    def claim():
        return claim_and_look_ahead(1, claimed_by="d")

    NoOp3.start()
    # Rows that earlier tests rolled back leave dead entries in the indexes until a vacuum: without
    # one here, the first measurement read 40 pages where it reads 11 (seen in CI, in random order).
    settle(WorkflowStep, WorkflowRun, FanOutJob)
    alone = pages_read(claim, "AS step_key")
    NoOp3.start_many([{} for _ in range(20_000)])
    WorkflowStep.objects.filter(status="scheduled").exclude(pk=WorkflowStep.objects.earliest("pk").pk).update(
        scheduled_at=clock.now() + timedelta(days=3)
    )
    settle(WorkflowStep, WorkflowRun, FanOutJob)
    behind_them = pages_read(claim, "AS step_key")

    assert behind_them - alone <= MORE_PAGES, (alone, behind_them)
    (claimed,) = claim()[0]  # the one due
    assert claimed.pk == WorkflowStep.objects.earliest("pk").pk
    steps, ahead = claim()
    assert steps == [] and ahead.next_due_at > clock.now() + timedelta(days=2)


def fan_out(jobs: int) -> WorkflowRun:
    """A Squares run whose fan-out of ``jobs`` jobs is open (the jobs pending, due now)."""
    wf = Squares.start(count=jobs)
    execute_step(claim_step(WorkflowStep.objects.get(run=wf.record).pk))
    return wf.record


def test_a_job_claim_and_the_look_ahead_read_no_more_with_twenty_thousand_jobs_backing_off():
    def job_claim():
        return claim_due_jobs(10, claimed_by="d")

    def claim():
        return claim_and_look_ahead(10, claimed_by="d")

    due = fan_out(1)
    settle(FanOutJob, WorkflowStep, WorkflowRun)
    alone = pages_read(job_claim, "SELECT id, function, scheduled_at"), pages_read(claim, "AS step_key")
    backing_off = fan_out(20_000)
    later = clock.now() + timedelta(hours=1)
    FanOutJob.objects.filter(step__run=backing_off).update(scheduled_at=later)  # as after a failure each
    settle(FanOutJob, WorkflowStep, WorkflowRun)
    behind_them = pages_read(job_claim, "SELECT id, function, scheduled_at"), pages_read(claim, "AS step_key")

    assert all(after - before <= MORE_PAGES for before, after in zip(alone, behind_them, strict=True)), (
        alone,
        behind_them,
    )
    (job,) = job_claim()
    assert job.step.run_id == due.pk
    steps, ahead = claim()
    assert steps == [] and not ahead.jobs_due and ahead.next_due_at == later
