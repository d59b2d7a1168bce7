"""``idempotency_key=`` on ``start()`` of a debounced class: each key names one start, collapsed or not.

A repeated key gives the run its start went into, with ``duplicate_start``, and moves nothing:
no collapse, no new arguments, the first step's time kept. That holds for the run's first
start's key and for the key of a start that collapsed into it (kept in its ``debounced``
event). A new key for the same debounce key collapses as usual. A key repeated with another
subject or other arguments than its start gave is an ``IdempotencyConflict``.
"""

from datetime import timedelta

import pytest
from django.db import connection

from pgbus_workflows import Debounce, IdempotencyConflict, Workflow, step
from pgbus_workflows.models import WorkflowEvent, WorkflowRun
from pgbus_workflows.services.debounce import start_of_key
from tests.sql.test_query_plans import nodes, plan_of
from tests.support import events_of, kinds, run_next, scheduled, snapshot
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

PERIOD = timedelta(seconds=30)


def _runs(cls):
    return WorkflowRun.objects.filter(workflow_class=cls.name).count()


class AccountSync(Workflow):
    """One run per account; every caller passes an idempotency key (a webhook's delivery id)."""

    name = "debounce_keys_account_sync"
    allow_multiple = True
    step_options = {"queue": "debounce_keys"}
    debounce = Debounce(period=PERIOD, key=lambda wf: f"account:{wf.arguments['account_id']}")

    @step
    def push(self):
        return None

    @step
    def confirm(self):
        return None


def test_a_repeated_key_gives_its_run_as_a_duplicate_start_and_moves_nothing():
    wf = AccountSync.start(idempotency_key="delivery-1", account_id=1, note="a")
    before = snapshot(wf)
    again = AccountSync.start(idempotency_key="delivery-1", account_id=1, note="a")
    assert again.duplicate_start and not again.debounced
    assert again.workflow_id == wf.workflow_id
    assert snapshot(wf) == before  # no debounced event, the same first step at the same time
    assert kinds(wf) == ["started"]


def test_a_new_key_for_the_same_debounce_key_collapses_and_its_event_keeps_the_key():
    wf = AccountSync.start(idempotency_key="delivery-1", account_id=2, note="a")
    collapsed = AccountSync.start(idempotency_key="delivery-2", account_id=2, note="b")
    assert collapsed.debounced and not collapsed.duplicate_start
    assert collapsed.workflow_id == wf.workflow_id
    run = WorkflowRun.objects.get(pk=wf.record.pk)
    assert run.idempotency_key == "delivery-1"  # the run's column keeps its first start's key
    assert run.arguments == {"account_id": 2, "note": "b"}
    [event] = events_of(wf, "debounced")
    assert event.details["idempotency_key"] == "delivery-2"
    assert event.details["arguments"] == {"account_id": 2, "note": "b"}


def test_after_a_collapse_repeating_either_start_gives_the_run_and_moves_nothing():
    wf = AccountSync.start(idempotency_key="delivery-1", account_id=3, note="a")
    AccountSync.start(idempotency_key="delivery-2", account_id=3, note="b")
    before = snapshot(wf)

    first = AccountSync.start(idempotency_key="delivery-1", account_id=3, note="a")  # its own arguments
    second = AccountSync.start(idempotency_key="delivery-2", account_id=3, note="b")

    assert (first.duplicate_start, second.duplicate_start) == (True, True)
    assert (first.debounced, second.debounced) == (False, False)
    assert first.workflow_id == second.workflow_id == wf.workflow_id
    assert snapshot(wf) == before  # the latest arguments stay, the first step is not moved again
    assert kinds(wf) == ["started", "debounced"]


class LateRetry(Workflow):
    """A webhook retried after its run began: the retry is the same start, not a new run."""

    name = "debounce_keys_late_retry"
    allow_multiple = True
    step_options = {"queue": "debounce_keys_late"}
    debounce = Debounce(period=PERIOD, key=lambda wf: f"account:{wf.arguments['account_id']}")

    @step
    def push(self):
        return None


def test_a_key_repeated_after_its_run_began_or_ended_gives_that_run_not_a_new_one():
    wf = LateRetry.start(idempotency_key="delivery-1", account_id=4)
    LateRetry.start(idempotency_key="delivery-2", account_id=4, n=2)
    run_next(wf)  # its only step ran: the run finished
    assert wf.status == "finished"
    for key, arguments in (("delivery-1", {}), ("delivery-2", {"n": 2})):
        again = LateRetry.start(idempotency_key=key, account_id=4, **arguments)
        assert again.duplicate_start and again.workflow_id == wf.workflow_id
    assert _runs(LateRetry) == 1
    fresh = LateRetry.start(idempotency_key="delivery-3", account_id=4)  # a new key: a new run
    assert not fresh.duplicate_start and fresh.workflow_id != wf.workflow_id


class StrictKeys(Workflow):
    """A key names one start: used again for other arguments, it is refused."""

    name = "debounce_keys_strict"
    allow_multiple = True
    step_options = {"queue": "debounce_keys_strict"}
    debounce = Debounce(period=PERIOD, key=lambda wf: f"account:{wf.arguments['account_id']}")

    @step
    def push(self):
        return None


def test_a_key_repeated_with_other_arguments_than_its_start_gave_is_a_conflict_and_writes_nothing():
    wf = StrictKeys.start(idempotency_key="delivery-1", account_id=5, note="a")
    StrictKeys.start(idempotency_key="delivery-2", account_id=5, note="b")
    before = snapshot(wf)
    with pytest.raises(IdempotencyConflict, match=r"idempotency_key 'delivery-2' of debounce_keys_strict is taken"):
        StrictKeys.start(idempotency_key="delivery-2", account_id=5, note="c")
    # The run's arguments are now delivery-2's: still, delivery-1 asked for note "a".
    with pytest.raises(IdempotencyConflict, match=r"'delivery-1' .*\(other arguments\)"):
        StrictKeys.start(idempotency_key="delivery-1", account_id=5, note="b")
    assert snapshot(wf) == before


class AnySubject(Workflow):
    """A key of the arguments: starts about other orders collapse into the first one's run."""

    name = "debounce_keys_any_subject"
    allow_multiple = True
    step_options = {"queue": "debounce_keys_subject"}
    debounce = Debounce(period=PERIOD, key=lambda wf: f"batch:{wf.arguments['batch']}")

    @step
    def push(self):
        return None


def test_a_collapsed_start_of_another_subject_records_it_and_its_key_is_compared_with_it(order):
    other = Order.objects.create()
    wf = AnySubject.start(order, idempotency_key="delivery-1", batch=1)
    collapsed = AnySubject.start(other, idempotency_key="delivery-2", batch=1)
    assert collapsed.debounced and collapsed.workflow_id == wf.workflow_id
    [event] = events_of(wf, "debounced")
    assert event.details["subject"] == ["testapp.order", str(other.pk)]  # the run's subject stays the first's
    assert AnySubject.start(other, idempotency_key="delivery-2", batch=1).duplicate_start
    with pytest.raises(IdempotencyConflict, match=rf"subject testapp.order {other.pk}, not testapp.order {order.pk}"):
        AnySubject.start(order, idempotency_key="delivery-2", batch=1)


def test_a_collapsed_starts_key_is_found_through_the_debounced_events_index():
    wf = AccountSync.start(idempotency_key="delivery-1", account_id=6)
    AccountSync.start(idempotency_key="delivery-2", account_id=6)
    seen = []

    def record(execute, text, params, many, context):
        seen.append((text, params))
        return execute(text, params, many, context)

    with connection.execute_wrapper(record):
        run, _given = start_of_key(AccountSync, "delivery-2")
    assert run.pk == wf.record.pk
    statement = next((text, params) for text, params in seen if "pgbus_workflows_workflowevent" in text)
    plan = plan_of(statement)
    assert "pgbus_wf_event_debounced_key" in [node.get("Index Name") for node in nodes(plan)], plan


def test_keys_are_per_class_and_a_collapse_in_one_class_does_not_answer_another():
    AccountSync.start(idempotency_key="shared", account_id=7)
    AccountSync.start(idempotency_key="collapsed-here", account_id=7)
    other = StrictKeys.start(idempotency_key="collapsed-here", account_id=7)
    assert not other.duplicate_start and not other.debounced
    assert scheduled(other).step_name == "push"


def test_a_key_in_an_older_debounced_event_without_arguments_is_compared_with_the_runs():
    wf = AccountSync.start(idempotency_key="delivery-1", account_id=8, note="a")
    AccountSync.start(idempotency_key="delivery-2", account_id=8, note="b")
    [event] = events_of(wf, "debounced")
    older = {"argument_keys": ["account_id", "note"], "idempotency_key": "delivery-2"}
    WorkflowEvent.objects.filter(pk=event.pk).update(details=older)  # as the first release wrote it
    again = AccountSync.start(idempotency_key="delivery-2", account_id=8, note="b")
    assert again.duplicate_start and again.workflow_id == wf.workflow_id
