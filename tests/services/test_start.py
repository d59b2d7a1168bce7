"""``Workflow.start()``: the run, its first step and a ``started`` event, in one transaction."""

import json
import threading
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from pgbus_workflows import (
    AlreadyRunning,
    IdempotencyConflict,
    PayloadNotSerializable,
    PayloadTooLarge,
    Workflow,
    WorkflowError,
    removed_step,
    step,
)
from pgbus_workflows import signals as wf_signals
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.sql import clock, functions
from tests.procs import eventually
from tests.support import sessions_waiting_for_a_lock
from tests.testapp.models import Order


class StartTwoSteps(Workflow):
    name = "start_two_steps"

    @step
    def first(self):
        return None

    @step
    def second(self):
        return None


class StartOtherClass(Workflow):
    name = "start_other_class"

    @step
    def first(self):
        return None


class StartClassOptions(Workflow):
    name = "start_class_options"
    step_options = {"queue": "orders", "priority": 5}

    @step(wait=timedelta(minutes=10), timeout=300)
    def later(self):
        return None


class StartStepOptions(Workflow):
    name = "start_step_options"
    step_options = {"queue": "orders", "priority": 5}

    @step(queue="urgent", priority=-3, wait=90)
    def first(self):
        return None


class StartInheritsOptions(StartClassOptions):
    name = "start_inherits_options"


WAIT_CALLS: list[int] = []


def _wait_by_attempt(attempt):
    WAIT_CALLS.append(attempt)
    return timedelta(minutes=attempt * 3)


class StartCallableWait(Workflow):
    name = "start_callable_wait"

    @step(wait=_wait_by_attempt)
    def first(self):
        return None


class StartNoSteps(Workflow):
    name = "start_no_steps"


class StartOnlyGravestones(Workflow):
    name = "start_only_gravestones"
    gone = removed_step()


class StartMultiple(Workflow):
    name = "start_multiple"
    allow_multiple = True

    @step
    def first(self):
        return None


def _counts():
    return (WorkflowRun.objects.count(), WorkflowStep.objects.count(), WorkflowEvent.objects.count())


# -- what start() writes -----------------------------------------------------------------------


def test_start_writes_the_run_its_first_step_and_a_started_event(order):
    # The engine's clock (the server's, read once and carried forward), as start() reads it:
    # this host's clock differs from that reading by up to half a round trip, more under load.
    before = clock.now()
    wf = StartTwoSteps.start(order, warehouses=[1, 2])
    after = clock.now()

    assert isinstance(wf, StartTwoSteps)
    assert wf.duplicate_start is False
    assert (wf.status, wf.current_step) == ("ready", "first")
    assert wf.arguments == {"warehouses": [1, 2]}
    assert wf.subject == order
    assert _counts() == (1, 1, 1)

    run = WorkflowRun.objects.get()
    assert run.workflow_id == wf.workflow_id
    assert run.workflow_class == "start_two_steps"
    assert run.status == "ready"
    assert run.current_step == "first"
    assert (run.subject_type, run.subject_id) == ("testapp.order", str(order.pk))
    assert run.arguments == {"warehouses": [1, 2]}
    assert run.idempotency_key is None
    assert run.allow_multiple is False
    assert run.finished_at is None
    assert before <= run.created_at <= after
    assert run.started_at == run.created_at == run.status_changed_at

    first = WorkflowStep.objects.get()
    assert first.run_id == run.pk
    assert (first.step_name, first.attempt, first.status, first.outcome) == ("first", 1, "scheduled", "")
    assert first.queue == "workflows"
    assert first.priority == 0
    assert first.scheduled_at == run.created_at
    assert first.started_at is None
    assert first.timeout is None

    event = WorkflowEvent.objects.get()
    assert event.run_id == run.pk
    assert event.kind == "started"
    assert event.step is None
    assert event.to_status == "ready"
    assert event.details == {"arguments": {"warehouses": [1, 2]}}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("key", [None, "one-trip"])
def test_outside_a_transaction_start_is_one_statement(key):
    """One round trip on PostgreSQL: the run, its first attempt, its event and the NOTIFY."""
    order = Order.objects.create()
    clock.forget()
    clock.now()  # the server's clock just read: it is read again only every REANCHOR_EVERY seconds
    with CaptureQueriesContext(connection) as queries:
        wf = StartTwoSteps.start(order, idempotency_key=key)
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
    text = queries.captured_queries[0]["sql"]  # the statement, or from a connection's Nth start its function
    assert "pg_notify" in text or (text.startswith("SELECT * FROM ") and functions.PREFIX in text), text
    assert _counts() == (1, 1, 1)
    assert WorkflowStep.objects.get().run_id == wf.record.pk == WorkflowEvent.objects.get().run_id
    assert WorkflowEvent.objects.get().kind == "started"


def test_a_refused_start_inside_the_callers_transaction_leaves_it_usable(order):
    """No savepoint, and none needed: a refused insert raises nothing in the database."""
    holder = StartTwoSteps.start(order)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            with pytest.raises(AlreadyRunning) as raised:
                StartTwoSteps.start(order)
        assert raised.value.workflow.workflow_id == holder.workflow_id
        assert not any("SAVEPOINT" in q["sql"] for q in queries.captured_queries), queries.captured_queries
        assert _counts() == (1, 1, 1)  # the transaction still works, and nothing was added


def test_queue_and_priority_come_from_the_class_step_options(order):
    wf = StartClassOptions.start(order)
    first = wf.steps.get()
    assert (first.step_name, first.queue, first.priority) == ("later", "orders", 5)
    assert first.timeout == timedelta(seconds=300)


def test_a_subclass_inherits_the_step_options(order):
    first = StartInheritsOptions.start(order).steps.get()
    assert (first.queue, first.priority) == ("orders", 5)


def test_the_step_s_own_queue_and_priority_win(order):
    first = StartStepOptions.start(order).steps.get()
    assert (first.queue, first.priority) == ("urgent", -3)


def test_steps_that_name_no_queue_use_default_queue(order):
    with override_settings(PGBUS_WORKFLOWS={"DEFAULT_QUEUE": "elsewhere"}):
        wf = StartTwoSteps.start(order)
    assert wf.steps.get().queue == "elsewhere"


def test_the_first_step_is_scheduled_after_its_wait(order):
    wf = StartClassOptions.start(order)
    first = wf.steps.get()
    assert first.scheduled_at == wf.record.created_at + timedelta(minutes=10)
    other = StartStepOptions.start(order).steps.get()
    assert other.scheduled_at == other.run.created_at + timedelta(seconds=90)


def test_a_wait_callable_is_asked_for_attempt_one(order):
    WAIT_CALLS.clear()
    wf = StartCallableWait.start(order)
    assert WAIT_CALLS == [1]
    first = wf.steps.get()
    assert first.scheduled_at == wf.record.created_at + timedelta(minutes=3)


def test_a_subject_is_stored_as_app_label_model_and_text_pk(order):
    wf = StartTwoSteps.start(order)
    run = WorkflowRun.objects.get(pk=wf.record.pk)
    assert run.subject_type == "testapp.order"
    assert run.subject_id == str(order.pk)
    assert isinstance(run.subject_id, str)
    assert Workflow.find(wf.workflow_id).subject == order


def test_a_run_without_a_subject(db):
    wf = StartTwoSteps.start(note="no subject")
    run = WorkflowRun.objects.get()
    assert (run.subject_type, run.subject_id) == (None, None)
    assert wf.subject is None
    assert run.arguments == {"note": "no subject"}


def test_arguments_round_trip_as_json(order):
    ref = uuid.UUID("12345678-1234-5678-1234-567812345678")
    wf = StartTwoSteps.start(
        order,
        when=date(2024, 1, 2),
        at=datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        amount=Decimal("1.50"),
        ref=ref,
        ids=(1, 2),
        nested={"a": [1, None, True, 2.5], "b": {"c": "é"}},
    )
    expected = {
        "when": "2024-01-02",
        "at": "2024-01-02T03:04:05Z",
        "amount": "1.50",
        "ref": str(ref),
        "ids": [1, 2],
        "nested": {"a": [1, None, True, 2.5], "b": {"c": "é"}},
    }
    # the handle holds what the database gives back, not the Python objects
    assert wf.arguments == expected
    assert WorkflowRun.objects.get().arguments == expected
    assert wf.reload().arguments == expected
    assert Workflow.find(wf.workflow_id).arguments == expected


def test_no_arguments_is_an_empty_dict(order):
    wf = StartTwoSteps.start(order)
    assert wf.arguments == {}
    assert WorkflowRun.objects.get().arguments == {}


@pytest.mark.parametrize("bad", [object(), {1, 2}, b"bytes", Order])
def test_non_json_arguments_raise_and_write_nothing(order, bad):
    with pytest.raises(PayloadNotSerializable, match=r"start_two_steps arguments must be JSON-serialisable"):
        StartTwoSteps.start(order, idempotency_key="k", thing=bad)
    assert _counts() == (0, 0, 0)


def test_payload_not_serializable_is_a_type_error(order):
    with pytest.raises(TypeError):
        StartTwoSteps.start(order, thing=object())
    assert issubclass(PayloadNotSerializable, TypeError)
    assert issubclass(PayloadNotSerializable, WorkflowError)
    assert _counts() == (0, 0, 0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_not_json(order, bad):
    with pytest.raises(PayloadNotSerializable, match=r"start_two_steps arguments must be JSON-serialisable"):
        StartTwoSteps.start(order, ratio=bad)
    assert _counts() == (0, 0, 0)


def _args_of_size(size):
    """Arguments whose JSON is exactly ``size`` bytes."""
    overhead = len(json.dumps({"blob": ""}, cls=DjangoJSONEncoder).encode())
    arguments = {"blob": "x" * (size - overhead)}
    assert len(json.dumps(arguments, cls=DjangoJSONEncoder).encode()) == size
    return arguments


def test_arguments_over_max_payload_size_raise_and_write_nothing(order):
    with pytest.raises(PayloadTooLarge, match=r"arguments is 5000 bytes, over MAX_PAYLOAD_SIZE \(4096 bytes\)"):
        StartTwoSteps.start(order, **_args_of_size(5000))
    assert _counts() == (0, 0, 0)


def test_arguments_of_exactly_max_payload_size_are_accepted(order):
    wf = StartTwoSteps.start(order, **_args_of_size(4096))
    assert len(wf.arguments["blob"]) > 4000
    assert _counts() == (1, 1, 1)


def test_payload_size_counts_one_byte_over(order):
    with pytest.raises(PayloadTooLarge, match=r"is 4097 bytes, over MAX_PAYLOAD_SIZE \(4096 bytes\)"):
        StartTwoSteps.start(order, **_args_of_size(4097))
    assert _counts() == (0, 0, 0)


def test_max_payload_size_is_read_live(order):
    with override_settings(PGBUS_WORKFLOWS={"MAX_PAYLOAD_SIZE": 20}):
        with pytest.raises(PayloadTooLarge, match=r"is 21 bytes, over MAX_PAYLOAD_SIZE \(20 bytes\)"):
            StartTwoSteps.start(order, **_args_of_size(21))
    assert _counts() == (0, 0, 0)
    StartTwoSteps.start(order, **_args_of_size(21))
    assert _counts() == (1, 1, 1)


def test_an_unsaved_subject_raises_and_writes_nothing(db):
    with pytest.raises(ValueError, match=r"A workflow subject must be saved first"):
        StartTwoSteps.start(Order())
    assert _counts() == (0, 0, 0)


@pytest.mark.parametrize("subject", ["order-1", 42, {"pk": 1}])
def test_a_subject_that_is_not_a_model_raises_and_writes_nothing(db, subject):
    with pytest.raises(TypeError, match=r"A workflow subject must be a saved model instance or None, got"):
        StartTwoSteps.start(subject)
    assert _counts() == (0, 0, 0)


@pytest.mark.parametrize("key", ["", 42])
def test_a_bad_idempotency_key_raises_and_writes_nothing(order, key):
    with pytest.raises(ValueError, match=r"idempotency_key must be a non-empty string or None"):
        StartTwoSteps.start(order, idempotency_key=key)
    assert _counts() == (0, 0, 0)


# -- idempotency ------------------------------------------------------------------------------


def test_a_second_start_with_the_same_key_returns_the_first_run(order):
    first = StartTwoSteps.start(order, idempotency_key=f"order-{order.pk}", attempt="one")
    second = StartTwoSteps.start(order, idempotency_key=f"order-{order.pk}", attempt="one")
    assert first.duplicate_start is False
    assert second.duplicate_start is True
    assert isinstance(second, StartTwoSteps)
    assert second.workflow_id == first.workflow_id
    assert second.arguments == {"attempt": "one"}
    assert _counts() == (1, 1, 1)
    assert WorkflowRun.objects.get().idempotency_key == f"order-{order.pk}"


def test_the_same_key_with_other_arguments_raises_idempotency_conflict_and_writes_nothing(order):
    first = StartTwoSteps.start(order, idempotency_key=f"order-{order.pk}", attempt="one")
    with pytest.raises(IdempotencyConflict, match=r"taken by run .*other arguments.*nothing was started") as raised:
        StartTwoSteps.start(order, idempotency_key=f"order-{order.pk}", attempt="two")
    assert isinstance(raised.value, ValueError)
    assert raised.value.workflow.workflow_id == first.workflow_id
    assert _counts() == (1, 1, 1)


def test_the_same_key_for_another_subject_raises_idempotency_conflict_and_writes_nothing(order):
    first = StartTwoSteps.start(order, idempotency_key="shared")
    other = Order.objects.create()
    with pytest.raises(IdempotencyConflict, match=rf"subject testapp.order {order.pk}, not testapp.order {other.pk}"):
        StartTwoSteps.start(other, idempotency_key="shared")
    with pytest.raises(IdempotencyConflict, match=r"subject testapp.order \d+, not none"):
        StartTwoSteps.start(None, idempotency_key="shared")
    assert WorkflowRun.objects.get().workflow_id == first.workflow_id
    assert _counts() == (1, 1, 1)


def test_the_same_key_returns_the_first_run_after_it_finished(order):
    first = StartNoSteps.start(order, idempotency_key="once")
    assert first.status == "finished"
    second = StartNoSteps.start(order, idempotency_key="once")
    assert second.duplicate_start is True
    assert second.workflow_id == first.workflow_id
    assert second.status == "finished"
    assert WorkflowRun.objects.count() == 1


def test_the_same_key_returns_the_first_run_after_it_was_cancelled(order):
    first = StartTwoSteps.start(order, idempotency_key="once")
    first.cancel(actor="ops")
    second = StartTwoSteps.start(order, idempotency_key="once")
    assert second.duplicate_start is True
    assert (second.workflow_id, second.status) == (first.workflow_id, "cancelled")
    assert WorkflowRun.objects.count() == 1


def test_idempotency_keys_are_per_class(order):
    first = StartTwoSteps.start(order, idempotency_key="k")
    other = StartOtherClass.start(order, idempotency_key="k")
    assert other.duplicate_start is False
    assert other.workflow_id != first.workflow_id
    assert WorkflowRun.objects.count() == 2


# -- one ongoing run per subject -------------------------------------------------------------


def test_a_subject_with_an_ongoing_run_raises_already_running(order):
    holder = StartTwoSteps.start(order)
    expected = rf"start_two_steps already has an ongoing run for testapp.order {order.pk}: {holder.workflow_id}"
    with pytest.raises(AlreadyRunning, match=expected):
        StartTwoSteps.start(order, idempotency_key="new-key")
    assert _counts() == (1, 1, 1)


def test_already_running_carries_the_holder_handle(order):
    holder = StartTwoSteps.start(order)
    with pytest.raises(AlreadyRunning) as info:
        StartTwoSteps.start(order)
    error = info.value
    assert isinstance(error, WorkflowError)
    assert isinstance(error.workflow, StartTwoSteps)
    assert error.workflow.workflow_id == holder.workflow_id
    assert error.workflow.status == "ready"
    assert str(holder.workflow_id) in str(error)


def test_a_paused_run_keeps_the_slot(order):
    holder = StartTwoSteps.start(order)
    holder.pause(actor="ops", reason="hold on")
    with pytest.raises(AlreadyRunning) as info:
        StartTwoSteps.start(order)
    assert info.value.workflow.workflow_id == holder.workflow_id
    assert info.value.workflow.status == "paused"
    assert WorkflowRun.objects.count() == 1


def test_another_class_may_run_on_the_same_subject(order):
    StartTwoSteps.start(order)
    other = StartOtherClass.start(order)
    assert other.status == "ready"
    assert WorkflowRun.objects.filter(subject_id=str(order.pk)).count() == 2


def test_allow_multiple_allows_two_ongoing_runs(order):
    first = StartMultiple.start(order)
    second = StartMultiple.start(order)
    assert first.workflow_id != second.workflow_id
    assert WorkflowRun.objects.ongoing().filter(workflow_class="start_multiple").count() == 2
    assert all(run.allow_multiple for run in WorkflowRun.objects.all())
    assert WorkflowStep.objects.count() == 2


def test_runs_without_a_subject_never_collide(db):
    first = StartTwoSteps.start()
    second = StartTwoSteps.start()
    assert first.workflow_id != second.workflow_id
    assert WorkflowRun.objects.ongoing().count() == 2


def test_a_finished_run_frees_the_slot(order):
    first = StartNoSteps.start(order)
    assert first.status == "finished"
    second = StartNoSteps.start(order)
    assert second.workflow_id != first.workflow_id
    assert WorkflowRun.objects.filter(workflow_class="start_no_steps").count() == 2


def test_a_cancelled_run_frees_the_slot(order):
    first = StartTwoSteps.start(order)
    first.cancel(actor="ops")
    second = StartTwoSteps.start(order)
    assert second.status == "ready"
    assert second.workflow_id != first.workflow_id
    assert list(WorkflowRun.objects.order_by("id").values_list("status", flat=True)) == ["cancelled", "ready"]


# -- transactions -----------------------------------------------------------------------------


def test_start_inside_a_transaction_that_rolls_back_leaves_no_rows(order):
    with pytest.raises(RuntimeError, match="caller changed its mind"), transaction.atomic():
        StartTwoSteps.start(order, idempotency_key="rolled-back")
        assert _counts() == (1, 1, 1)
        raise RuntimeError("caller changed its mind")
    assert _counts() == (0, 0, 0)
    # the key and the slot are free again
    wf = StartTwoSteps.start(order, idempotency_key="rolled-back")
    assert wf.duplicate_start is False


def test_a_class_with_no_steps_finishes_at_once(order):
    wf = StartNoSteps.start(order, note="nothing to do")
    assert wf.status == "finished"
    run = WorkflowRun.objects.get()
    assert run.status == "finished"
    assert run.finished_at is not None
    assert WorkflowStep.objects.count() == 0
    assert list(WorkflowEvent.objects.order_by("id").values_list("kind", "to_status")) == [
        ("started", "ready"),
        ("finished", "finished"),
    ]


def test_a_class_with_only_gravestones_finishes_at_once(order):
    wf = StartOnlyGravestones.start(order)
    assert wf.status == "finished"
    assert WorkflowStep.objects.count() == 0


def test_workflow_started_is_sent_after_commit(order, django_capture_on_commit_callbacks):
    received = []

    def receiver(sender, **kwargs):
        received.append((sender, kwargs))

    wf_signals.workflow_started.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            wf = StartTwoSteps.start(order)
            assert received == []
    finally:
        wf_signals.workflow_started.disconnect(receiver)
    assert len(received) == 1
    sender, kwargs = received[0]
    assert sender == "start_two_steps"
    assert kwargs["workflow_id"] == wf.workflow_id
    assert (kwargs["subject_type"], kwargs["subject_id"]) == ("testapp.order", str(order.pk))


# -- concurrency (real threads, real transactions) --------------------------------------------


def _in_thread(target):
    """Run ``target`` in a thread with its own connection; returns (thread, outcome dict)."""
    outcome = {}

    def run():
        try:
            outcome["result"] = target()
        except Exception as error:  # reported to the test through outcome
            outcome["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _wait_until_blocked_on_a_lock():
    """Wait until another backend of this database waits on a lock (the second insert)."""
    eventually(sessions_waiting_for_a_lock, what="the second start to wait for the first one's insert")


def _hold_open_start(start, release, committed_or_not="commit"):
    """In a thread: start inside a transaction, then wait for ``release`` before ending it."""
    started = threading.Event()

    def target():
        with transaction.atomic():
            wf = start()
            started.set()
            assert release.wait(timeout=20)
            if committed_or_not == "rollback":
                transaction.set_rollback(True)
        return wf

    thread, outcome = _in_thread(target)
    assert started.wait(timeout=20), outcome
    return thread, outcome


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("second_by", ["first", "second"])
def test_two_threads_with_one_idempotency_key_make_one_run(second_by):
    order = Order.objects.create()
    release = threading.Event()
    first_thread, first = _hold_open_start(
        lambda: StartTwoSteps.start(order, idempotency_key="race", by="first"), release
    )
    # the first run is not committed: the second start does not see it and blocks on its insert
    second_thread, second = _in_thread(lambda: StartTwoSteps.start(order, idempotency_key="race", by=second_by))
    _wait_until_blocked_on_a_lock()
    release.set()
    first_thread.join(20)
    second_thread.join(20)

    assert "error" not in first, first
    assert first["result"].duplicate_start is False
    if second_by == "first":  # the same start: the first run, as a duplicate
        assert "error" not in second, second
        assert second["result"].duplicate_start is True
        assert second["result"].workflow_id == first["result"].workflow_id
    else:  # another start under the same key: refused, even when the key was taken an instant ago
        assert isinstance(second.get("error"), IdempotencyConflict), second
    assert WorkflowRun.objects.count() == 1
    assert WorkflowRun.objects.get().arguments == {"by": "first"}
    assert WorkflowStep.objects.count() == 1
    assert WorkflowEvent.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_many_threads_with_one_idempotency_key_make_one_run():
    order = Order.objects.create()
    barrier = threading.Barrier(6)

    def start():
        barrier.wait(timeout=20)
        return StartTwoSteps.start(order, idempotency_key="stampede")

    workers = [_in_thread(start) for _ in range(6)]
    for thread, _ in workers:
        thread.join(30)
    outcomes = [outcome for _, outcome in workers]
    assert [o for o in outcomes if "error" in o] == []
    handles = [o["result"] for o in outcomes]
    assert len({h.workflow_id for h in handles}) == 1
    assert sorted(h.duplicate_start for h in handles) == [False] + [True] * 5
    assert (WorkflowRun.objects.count(), WorkflowStep.objects.count(), WorkflowEvent.objects.count()) == (1, 1, 1)


@pytest.mark.django_db(transaction=True)
def test_two_threads_starting_one_subject_make_one_run():
    order = Order.objects.create()
    release = threading.Event()
    first_thread, first = _hold_open_start(lambda: StartTwoSteps.start(order), release)
    second_thread, second = _in_thread(lambda: StartTwoSteps.start(order))
    _wait_until_blocked_on_a_lock()
    release.set()
    first_thread.join(20)
    second_thread.join(20)

    assert "error" not in first, first
    assert isinstance(second.get("error"), AlreadyRunning), second
    holder = second["error"].workflow
    assert isinstance(holder, StartTwoSteps)
    assert holder.workflow_id == first["result"].workflow_id
    assert WorkflowRun.objects.count() == 1
    assert WorkflowStep.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_many_threads_starting_one_subject_make_one_run():
    order = Order.objects.create()
    barrier = threading.Barrier(6)

    def start():
        barrier.wait(timeout=20)
        return StartTwoSteps.start(order)

    workers = [_in_thread(start) for _ in range(6)]
    for thread, _ in workers:
        thread.join(30)
    outcomes = [outcome for _, outcome in workers]
    started = [o["result"] for o in outcomes if "result" in o]
    refused = [o["error"] for o in outcomes if "error" in o]
    assert len(started) == 1
    assert len(refused) == 5
    assert all(isinstance(e, AlreadyRunning) for e in refused)
    assert {e.workflow.workflow_id for e in refused} == {started[0].workflow_id}
    assert WorkflowRun.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_concurrent_start_goes_ahead_when_the_first_rolls_back():
    order = Order.objects.create()
    release = threading.Event()
    first_thread, first = _hold_open_start(lambda: StartTwoSteps.start(order), release, "rollback")
    second_thread, second = _in_thread(lambda: StartTwoSteps.start(order))
    _wait_until_blocked_on_a_lock()
    release.set()
    first_thread.join(20)
    second_thread.join(20)

    assert "error" not in first, first
    assert "error" not in second, second
    run = WorkflowRun.objects.get()
    assert run.workflow_id == second["result"].workflow_id
    assert run.workflow_id != first["result"].workflow_id


@pytest.mark.django_db(transaction=True)
def test_other_connections_see_nothing_until_the_caller_commits():
    order = Order.objects.create()

    def count_runs():
        return WorkflowRun.objects.count()

    with transaction.atomic():
        StartTwoSteps.start(order)
        thread, seen = _in_thread(count_runs)
        thread.join(20)
        assert seen == {"result": 0}
    thread, seen = _in_thread(count_runs)
    thread.join(20)
    assert seen == {"result": 1}
