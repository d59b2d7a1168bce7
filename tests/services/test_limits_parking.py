"""A full key's waiting steps are parked: out of every claim's way, put back in order when the key has room."""

import pytest
from django.db import connection

from pgbus_workflows.models import WorkflowLimiter, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.limiting import held_back_counts
from pgbus_workflows.sql import clock
from tests.sql.test_claim_ranges import pages_read, settle
from tests.sql.test_query_plans import nodes
from tests.support import scheduled
from tests.testapp.limited_workflows import KeyedSleeper
from tests.testapp.workflows import NoOp3

KEYED = ["keyed"]


def _claim(limit: int = 10) -> list[WorkflowStep]:
    return claim_due_steps(limit, queues=KEYED, claimed_by="test")


def _parked(runs) -> list[bool]:
    return [scheduled(wf).parked for wf in runs]


@pytest.mark.django_db
def test_a_claim_parks_the_steps_a_full_key_holds_back_and_puts_them_back_in_order_as_it_frees():
    runs = [KeyedSleeper.start(account="busy", seconds=0) for _ in range(4)]

    [first] = _claim()
    assert first.run_id == runs[0].record.pk
    assert _parked(runs[1:]) == [True, True, True]
    assert {scheduled(wf).parked_on for wf in runs[1:]} == {"concurrency:account:busy"}
    later = KeyedSleeper.start(account="busy", seconds=0)  # due after the parked ones, not parked yet

    order = [first.run_id]
    execute_step(first)
    while claimed := _claim():
        assert len(claimed) == 1  # the key's one slot: never two in progress
        order.append(claimed[0].run_id)
        execute_step(claimed[0])  # its next step, under the key too, is chained or claimed after the others

    assert list(dict.fromkeys(order)) == [wf.record.pk for wf in [*runs, later]]  # each run's first claim
    assert WorkflowLimiter.objects.get(name="concurrency:account:busy").in_use == 0


@pytest.mark.django_db
def test_a_parked_step_whose_key_has_room_is_put_back_and_claimed_by_the_next_claim():
    # As after a crash between a park and the release that should have put it back: the rows
    # say the key has room, and any claim puts its parked steps back.
    wf = KeyedSleeper.start(account="crashed", seconds=0)
    WorkflowStep.objects.filter(pk=scheduled(wf).pk).update(parked=True, parked_on="concurrency:account:crashed")

    [claimed] = _claim()

    assert claimed.run_id == wf.record.pk and not WorkflowStep.objects.get(pk=claimed.pk).parked


@pytest.mark.django_db
def test_a_step_parked_on_a_limiter_row_that_is_gone_is_put_back_and_claimed():
    wf = KeyedSleeper.start(account="deleted", seconds=0)
    WorkflowStep.objects.filter(pk=scheduled(wf).pk).update(parked=True, parked_on="concurrency:account:deleted")
    WorkflowLimiter.objects.filter(name="concurrency:account:deleted").delete()

    assert [s.run_id for s in _claim()] == [wf.record.pk]


@pytest.mark.django_db
def test_the_held_back_counts_read_the_parked_index():
    KeyedSleeper.start_many([{"arguments": {"account": "counted"}} for _ in range(3)])
    _claim()

    assert held_back_counts(clock.now())[("keyed_sleeper", "work")] == 2
    parked = WorkflowStep.objects.filter(status="scheduled", parked=True).values_list(
        "run__workflow_class", "step_name"
    )
    with connection.cursor() as cursor:
        # Statistics of this test's rows, not of whatever an earlier test left (a history of thousands).
        cursor.execute("ANALYZE pgbus_workflows_workflowstep")
        cursor.execute("SET LOCAL enable_seqscan = off")
        text, params = parked.query.sql_with_params()
        cursor.execute("EXPLAIN (FORMAT JSON) " + text, params)
        plan = cursor.fetchone()[0][0]["Plan"]
    assert "pgbus_wf_step_parked" in {n.get("Index Name") for n in nodes(plan)}, plan


HELD_BACK = 5_000

#: Pages a claim may read more behind the parked steps than without them: the indexes grown
#: by their entries are a level deeper (about 20 pages more where a quiet machine reads 50),
#: and indexes that earlier tests of the session bloated (thousands of rows inserted and rolled
#: back) add some: 76 more, seen after the admin's plan tests. Walked, the held-back steps cost
#: a claim twenty thousand.
MORE_PAGES = 150


@pytest.mark.django_db(transaction=True)
def test_a_claim_of_a_class_without_limits_reads_no_more_with_thousands_of_steps_held_back_by_a_key():
    def claim():
        return claim_due_steps(1, claimed_by="d")

    KeyedSleeper.start(account="full", seconds=0)
    [holder] = _claim(1)  # the key's one slot, kept while the others wait
    NoOp3.start()
    settle(WorkflowStep)
    alone = pages_read(claim, "AS step_key")
    KeyedSleeper.start_many([{"arguments": {"account": "full"}} for _ in range(HELD_BACK)])
    WorkflowStep.objects.filter(status="scheduled", step_name="a").update(scheduled_at=clock.now())  # due after them
    settle(WorkflowStep)
    walked = pages_read(claim, "AS step_key")  # not parked yet: the claim walks past them
    assert _claim(1) == []  # finds them held back, and parks them
    assert WorkflowStep.objects.filter(status="scheduled", parked=True).count() == HELD_BACK
    settle(WorkflowStep)
    behind_them = pages_read(claim, "AS step_key")

    assert behind_them - alone <= MORE_PAGES, (alone, behind_them, walked)
    assert walked - alone > 20 * MORE_PAGES, (alone, behind_them, walked)
    [claimed] = claim()
    assert claimed.step_name == "a" and holder.status == "in_progress"
