"""``Workflow.start_many()``: many runs in one transaction, one ``INSERT`` per table, ``start()``'s rules."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pgbus_workflows import AlreadyRunning, IdempotencyConflict, PayloadNotSerializable, Workflow, step
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.executor import run_due_steps
from pgbus_workflows.sql import clock
from tests.testapp.models import Order


class ManyTwoSteps(Workflow):
    name = "many_two_steps"

    @step
    def first(self):
        return {"seen": self.arguments.get("n")}

    @step
    def second(self):
        return None


class ManyMultiple(Workflow):
    name = "many_multiple"
    allow_multiple = True

    @step
    def only(self):
        return None


class ManyNoSteps(Workflow):
    name = "many_no_steps"


def _counts():
    return (WorkflowRun.objects.count(), WorkflowStep.objects.count(), WorkflowEvent.objects.count())


def _inserts(queries, model):
    table = connection.ops.quote_name(model._meta.db_table)
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith(f"INSERT INTO {table}")]


def test_each_item_gets_a_run_its_first_attempt_and_a_started_event_in_order(db):
    orders = [Order.objects.create() for _ in range(3)]
    items = [orders[0], {"subject": orders[1], "arguments": {"n": 1}}, {"arguments": {"n": 2}}, None]
    handles = ManyTwoSteps.start_many(items)

    assert [h.subject for h in handles] == [orders[0], orders[1], None, None]
    assert [h.arguments for h in handles] == [{}, {"n": 1}, {"n": 2}, {}]
    assert all(isinstance(h, ManyTwoSteps) and not h.duplicate_start for h in handles)
    assert _counts() == (4, 4, 4)
    for handle in handles:
        run = WorkflowRun.objects.get(workflow_id=handle.workflow_id)
        assert (run.status, run.current_step) == ("ready", "first")
        (attempt,) = WorkflowStep.objects.filter(run=run)
        assert (attempt.step_name, attempt.attempt, attempt.status, attempt.queue) == (
            "first",
            1,
            "scheduled",
            "workflows",
        )
        (event,) = WorkflowEvent.objects.filter(run=run)
        assert (event.kind, event.to_status, event.details) == ("started", "ready", {"arguments": run.arguments})


@pytest.mark.parametrize("count", [3, 40])  # a parameter per value, then an array per column
def test_one_insert_per_table_whatever_the_count(db, count):
    clock.forget()
    clock.now()
    with CaptureQueriesContext(connection) as queries:
        ManyTwoSteps.start_many([{"arguments": {"n": n}} for n in range(count)])
    assert [len(_inserts(queries, model)) for model in (WorkflowRun, WorkflowStep, WorkflowEvent)] == [1, 1, 1]
    assert _counts() == (count, count, count)
    assert sorted(WorkflowRun.objects.values_list("arguments__n", flat=True)) == list(range(count))


def test_the_runs_it_starts_run_to_their_end(db):
    ManyTwoSteps.start_many([{"arguments": {"n": n}} for n in range(25)])
    run_due_steps(limit=1000)
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"finished"}
    outputs = sorted(WorkflowStep.objects.filter(step_name="first").values_list("output__seen", flat=True))
    assert outputs == list(range(25))


def test_no_items_start_nothing(db):
    assert ManyTwoSteps.start_many([]) == []
    assert _counts() == (0, 0, 0)


def test_a_key_used_before_for_the_same_start_gives_its_run(db):
    first = ManyTwoSteps.start(idempotency_key="k1", n=1)
    handles = ManyTwoSteps.start_many([{"idempotency_key": "k1", "arguments": {"n": 1}}, {"idempotency_key": "k2"}])
    assert handles[0].workflow_id == first.workflow_id and handles[0].duplicate_start
    assert not handles[1].duplicate_start
    assert _counts() == (2, 2, 2)


def test_one_key_twice_in_one_call_is_one_run(db):
    handles = ManyTwoSteps.start_many([{"idempotency_key": "same"}, {"idempotency_key": "same"}])
    assert handles[0].workflow_id == handles[1].workflow_id and handles[1].duplicate_start
    assert _counts() == (1, 1, 1)


def test_a_key_used_for_another_start_raises_and_writes_nothing(db):
    ManyTwoSteps.start(idempotency_key="taken", n=1)
    before = _counts()
    with pytest.raises(IdempotencyConflict, match="taken"):
        ManyTwoSteps.start_many([{"idempotency_key": "fresh"}, {"idempotency_key": "taken", "arguments": {"n": 2}}])
    assert _counts() == before


def test_a_subject_with_an_ongoing_run_raises_already_running_and_writes_nothing(db):
    busy, free = Order.objects.create(), Order.objects.create()
    holder = ManyTwoSteps.start(busy)
    with pytest.raises(AlreadyRunning) as raised:
        ManyTwoSteps.start_many([free, busy])
    assert raised.value.workflow.workflow_id == holder.workflow_id
    assert _counts() == (1, 1, 1)


def test_two_items_for_one_subject_raise_already_running(db):
    order = Order.objects.create()
    with pytest.raises(AlreadyRunning):
        ManyTwoSteps.start_many([order, order])
    assert _counts() == (0, 0, 0)


def test_allow_multiple_takes_two_items_for_one_subject(db):
    order = Order.objects.create()
    assert len(ManyMultiple.start_many([order, order])) == 2
    assert _counts() == (2, 2, 2)


def test_a_class_without_steps_finishes_each_run_at_once(db):
    handles = ManyNoSteps.start_many([None, None])
    assert [h.reload().status for h in handles] == ["finished", "finished"]


@pytest.mark.parametrize(
    ("item", "error", "message"),
    [
        ({"subjet": None}, TypeError, r"item 1 has unknown keys \['subjet'\]"),
        ({"arguments": [1, 2]}, TypeError, "item 1: arguments must be a mapping"),
        ({"arguments": {"when": object()}}, PayloadNotSerializable, "JSON"),
        ({"idempotency_key": ""}, ValueError, "idempotency_key must be a non-empty string"),
        ("not a model", TypeError, "saved model instance"),
        (Order(), ValueError, "must be saved first"),
    ],
)
def test_a_bad_item_raises_before_anything_is_written(db, item, error, message):
    with pytest.raises(error, match=message):
        ManyTwoSteps.start_many([None, item])
    assert _counts() == (0, 0, 0)
