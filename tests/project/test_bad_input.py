"""A tour of what users get wrong, entry point by entry point.

Each call is fed bad input and must fail with a clear exception (its type and its message)
and write nothing: every table is read before and after. Where the bad input is only
found while a step runs (an output, a fan-out's jobs), the error goes to the step's
policy and is recorded on the attempt's row, and nothing of the bad value is stored.
``@step`` misconfigurations are in ``tests/dsl/test_definitions.py``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.apps import apps
from django.contrib.messages.constants import WARNING
from django.urls import reverse

from pgbus_workflows import Job, Workflow, fan_out, removed_step, step
from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.exceptions import (
    ConfigurationError,
    InvalidTransition,
    NotOngoing,
    NotPaused,
    PayloadNotSerializable,
    PayloadTooLarge,
    StepNotDefined,
)
from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services import operator
from pgbus_workflows.services.claims import claim_due_steps, claim_step
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import messages_of, operation_url, run_next
from tests.testapp.jobs import square
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()
LIMIT = 4096  # MAX_PAYLOAD_SIZE in tests/settings.py
BIG = "x" * (LIMIT + 10)


# -- the workflows -----------------------------------------------------------------------------------


class BadOne(Workflow):
    """One step whose output the arguments choose."""

    name = "bad_one"

    @step
    def only(self):
        kind = self.arguments.get("output")
        if kind == "big":
            return BIG
        if kind == "object":
            return {"when": object()}
        return {"fine": True}


class BadWaits(Workflow):
    name = "bad_waits"

    @step(wait_for="go")
    def gate(self):
        return self.received_signal.payload

    @step
    def after(self):
        pass


class BadTwo(Workflow):
    name = "bad_two"
    extra_signals = ["go"]

    @step
    def first(self):
        pass

    @step
    def second(self):
        pass


class BadGrave(Workflow):
    """``old`` was deleted, its name kept by a gravestone."""

    name = "bad_grave"

    @step
    def first(self):
        pass

    old = removed_step()

    @step
    def last(self):
        pass


class BadGone(Workflow):
    """Unregistered by a test, as if its code had been deleted while its runs remain."""

    name = "bad_gone"

    @step
    def one(self):
        pass

    @step
    def two(self):
        pass


class BadFanOut(Workflow):
    """The fan-out body returns what ``arguments["mode"]`` says."""

    name = "bad_fan_out"

    @fan_out
    def spread(self):
        mode = self.arguments["mode"]
        if mode == "non_job":
            return [Job(square, 1), 2]
        if mode == "lambda":
            return [Job(lambda n: n, 1)]
        if mode == "builtin":
            return [Job(len, [1, 2])]
        if mode == "oversize":
            return [Job(square, 1), Job(square, BIG)]
        if mode == "not_json":
            return [Job(square, object())]
        if mode == "not_iterable":
            return 42
        return {"a": Job(square, 1)}  # a dict: not an iterable of jobs

    @step
    def after(self):
        pass


# -- helpers -------------------------------------------------------------------------------------------

WORKFLOW_MODELS = list(apps.get_app_config("pgbus_workflows").get_models())
APP_MODELS = list(apps.get_app_config("testapp").get_models())


def everything() -> dict[str, Any]:
    """Every workflow row (all their values) and the row count of every test-app table."""
    rows: dict[str, Any] = {m.__name__: list(m.objects.order_by("pk").values()) for m in WORKFLOW_MODELS}
    rows.update({m.__name__: m.objects.count() for m in APP_MODELS})
    return rows


@contextmanager
def changes_nothing() -> Iterator[None]:
    before = everything()
    yield
    assert everything() == before, "a refused call wrote rows"


def finished_run(order: Order) -> Workflow:
    wf = BadTwo.start(order)
    helpers.speedrun_workflow(wf)
    assert wf.status == "finished"
    return wf


def cancelled_run(order: Order) -> Workflow:
    wf = BadTwo.start(order)
    wf.cancel(reason="done with it")
    assert wf.status == "cancelled"
    return wf


def reschedule_as(wf: Workflow, step_name: str) -> WorkflowStep:
    """Make the scheduled step name ``step_name``, as a row written by an older deploy would."""
    row = WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled")
    WorkflowStep.objects.filter(pk=row.pk).update(step_name=step_name)
    WorkflowRun.objects.filter(pk=wf.record.pk).update(current_step=step_name)
    wf.reload()
    return row


# -- start() -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({"when": object()}, id="object"),
        pytest.param({"tags": {1, 2}}, id="set"),
        pytest.param({"raw": b"bytes"}, id="bytes"),
        pytest.param({"ratio": float("nan")}, id="nan"),
        pytest.param({"nested": [{"deep": object()}]}, id="nested"),
    ],
)
def test_start_with_non_json_arguments_raises_and_writes_nothing(order, arguments):
    with changes_nothing(), pytest.raises(PayloadNotSerializable, match="bad_two arguments must be JSON-serialisable"):
        BadTwo.start(order, **arguments)


def test_start_with_oversize_arguments_names_the_size_and_the_limit_and_writes_nothing(order):
    with changes_nothing(), pytest.raises(PayloadTooLarge, match=r"bad_two arguments is \d+ bytes, over MAX_PAYLOAD"):
        BadTwo.start(order, blob=BIG)


@pytest.mark.parametrize("subject", ["order-1", 42, {"pk": 1}, Order])
def test_start_with_a_subject_that_is_not_a_model_instance_raises_and_writes_nothing(db, subject):
    with changes_nothing(), pytest.raises(TypeError, match="must be a saved model instance or None"):
        BadTwo.start(subject)


def test_start_with_an_unsaved_subject_raises_and_writes_nothing(db):
    with changes_nothing(), pytest.raises(ValueError, match="must be saved first"):
        BadTwo.start(Order())


@pytest.mark.parametrize("key", [5, "", b"key", uuid.UUID(int=1), ["k"]])
def test_start_with_an_idempotency_key_that_is_not_a_non_empty_string_raises_and_writes_nothing(order, key):
    with changes_nothing(), pytest.raises(ValueError, match="idempotency_key must be a non-empty string or None"):
        BadTwo.start(order, idempotency_key=key)


def test_start_of_the_abstract_base_class_raises_and_writes_nothing(db):
    with changes_nothing(), pytest.raises(ConfigurationError, match="is abstract"):
        Workflow.start()


# -- signals ---------------------------------------------------------------------------------------------


def test_a_non_json_signal_payload_raises_and_writes_nothing(order):
    wf = BadWaits.start(order)
    with changes_nothing(), pytest.raises(PayloadNotSerializable, match="signal 'go' payload must be JSON"):
        wf.signal("go", {"when": object()})
    with changes_nothing(), pytest.raises(PayloadNotSerializable, match="signal 'go' payload must be JSON"):
        BadWaits.signal_for(order, "go", payload={1, 2})


def test_an_oversize_signal_payload_raises_and_writes_nothing(order):
    wf = BadWaits.start(order)
    run_next(wf)
    assert wf.status == "waiting"
    with changes_nothing(), pytest.raises(PayloadTooLarge, match=r"signal 'go' payload is \d+ bytes, over MAX"):
        wf.signal("go", {"blob": BIG})
    with changes_nothing(), pytest.raises(PayloadTooLarge, match=r"signal 'go' payload is \d+ bytes, over MAX"):
        BadWaits.signal_for(order, "go", payload=BIG, missing="ignore")
    assert wf.reload().status == "waiting"


@pytest.mark.parametrize("name", ["", "   ", None, 7])
def test_a_signal_without_a_name_raises_and_writes_nothing(order, name):
    wf = BadWaits.start(order)
    with changes_nothing(), pytest.raises(ValueError, match="A signal name must be a non-empty string"):
        wf.signal(name)


@pytest.mark.parametrize("key", [5, "", b"k"])
def test_a_signal_idempotency_key_that_is_not_a_non_empty_string_raises_and_writes_nothing(order, key):
    wf = BadWaits.start(order)
    with changes_nothing(), pytest.raises(ValueError, match="idempotency_key must be a non-empty string or None"):
        wf.signal("go", idempotency_key=key)
    with changes_nothing(), pytest.raises(ValueError, match="idempotency_key must be a non-empty string or None"):
        BadWaits.signal_for(order, "go", idempotency_key=key)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda wf, order: wf.signal("g" * 256), id="signal_name"),
        pytest.param(lambda wf, order: wf.signal("go", idempotency_key="k" * 256), id="signal_key"),
        pytest.param(lambda wf, order: BadWaits.signal_for(order, "g" * 256), id="signal_for_name"),
    ],
)
def test_a_signal_name_or_key_over_255_characters_raises_a_clear_error_and_writes_nothing(order, call):
    wf = BadWaits.start(order)
    with changes_nothing(), pytest.raises(ValueError, match="at most 255 characters"):
        call(wf, order)


def test_start_with_an_idempotency_key_over_255_characters_raises_a_clear_error_and_writes_nothing(order):
    with changes_nothing(), pytest.raises(ValueError, match="at most 255 characters"):
        BadTwo.start(order, idempotency_key="k" * 256)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda wf, order: wf.signal("go", actor="a" * 256), id="signal"),
        pytest.param(lambda wf, order: BadWaits.signal_for(order, "go", actor="a" * 256), id="signal_for"),
        pytest.param(lambda wf, order: wf.pause(actor="a" * 256), id="pause"),
        pytest.param(lambda wf, order: wf.cancel(actor="a" * 256), id="cancel"),
    ],
)
def test_an_actor_over_255_characters_raises_a_clear_error_and_writes_nothing(order, call):
    wf = BadWaits.start(order)
    with changes_nothing(), pytest.raises(ValueError, match="at most 255 characters"):
        call(wf, order)


@pytest.mark.parametrize("make", [finished_run, cancelled_run], ids=["finished", "cancelled"])
def test_a_signal_to_a_finished_or_cancelled_run_raises_not_ongoing_and_writes_nothing(order, make):
    wf = make(order)
    with changes_nothing(), pytest.raises(NotOngoing, match=rf"Cannot signal a {wf.status} workflow .*'go' refused"):
        wf.signal("go", {"late": True})
    with changes_nothing(), pytest.raises(NotOngoing, match=r"has no ongoing run for testapp\.order"):
        BadTwo.signal_for(order, "go")
    with changes_nothing():
        assert BadTwo.signal_for(order, "go", missing="ignore") is None


def test_signal_for_a_subject_with_no_run_at_all(order):
    with (
        changes_nothing(),
        pytest.raises(NotOngoing, match=f"bad_waits has no ongoing run for testapp.order {order.pk}"),
    ):
        BadWaits.signal_for(order, "go")
    with changes_nothing():
        assert BadWaits.signal_for(order, "go", missing="ignore") is None


def test_signal_for_with_a_none_subject_points_to_the_handle(order):
    BadWaits.start()  # a subject-less run exists: signal_for still cannot guess it
    with changes_nothing(), pytest.raises(ValueError, match=r"needs a subject; signal a subject-less run through"):
        BadWaits.signal_for(None, "go")
    with changes_nothing(), pytest.raises(ValueError, match="needs a subject"):
        BadWaits.signal_for(None, "go", missing="ignore")  # "ignore" is about a missing run, not a missing subject


@pytest.mark.parametrize("missing", ["skip", "IGNORE", None, True])
def test_signal_for_with_a_bad_missing_value_raises_before_anything(order, missing):
    BadWaits.start(order)
    with changes_nothing(), pytest.raises(ValueError, match="missing must be 'raise' or 'ignore'"):
        BadWaits.signal_for(order, "go", missing=missing)


def test_signal_for_with_a_subject_that_is_not_a_saved_model(order):
    BadWaits.start(order)
    with changes_nothing(), pytest.raises(TypeError, match="must be a saved model instance or None, got str"):
        BadWaits.signal_for("order-1", "go")
    with changes_nothing(), pytest.raises(ValueError, match="must be saved first"):
        BadWaits.signal_for(Order(), "go", missing="ignore")


# -- step outputs (found while the step runs: recorded on the attempt) --------------------------------------


@pytest.mark.parametrize(
    ("output", "error_class", "message"),
    [
        ("big", "PayloadTooLarge", rf"only output is \d+ bytes, over MAX_PAYLOAD_SIZE \({LIMIT} bytes\)"),
        ("object", "PayloadNotSerializable", "only output must be JSON-serialisable"),
    ],
)
def test_a_bad_step_output_fails_the_attempt_and_stores_no_output(order, output, error_class, message):
    wf = BadOne.start(order, output=output)

    row = run_next(wf)

    assert (row.status, row.outcome, row.output) == ("failed", "failed", None)
    assert row.error_class == f"pgbus_workflows.exceptions.{error_class}"
    assert re.search(message, row.error_message), row.error_message
    assert wf.status == "paused" and error_class in wf.record.paused_reason
    assert not WorkflowStep.objects.filter(run_id=wf.record.pk, status="scheduled").exists()


# -- fan-out bodies ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "error_class", "message"),
    [
        ("non_job", "TypeError", "fan-out step spread returned 2 at index 1, not a Job"),
        ("not_iterable", "TypeError", "fan-out step spread must return an iterable of Job or of Child, got int"),
        ("dict", "TypeError", "fan-out step spread must return an iterable of Job or of Child, got dict"),
        ("lambda", "pgbus_workflows.exceptions.ConfigurationError", "must be a module-level function, not .*<lambda>"),
        ("builtin", "pgbus_workflows.exceptions.ConfigurationError", "must be a plain function, got <built-in"),
        (
            "oversize",
            "pgbus_workflows.exceptions.PayloadTooLarge",
            r"arguments of tests.testapp.jobs.square #1 is \d+ bytes, over MAX_PAYLOAD_SIZE",
        ),
        ("not_json", "pgbus_workflows.exceptions.PayloadNotSerializable", "arguments of tests.testapp.jobs.square #0"),
    ],
)
def test_a_bad_fan_out_body_fails_the_step_and_opens_no_job(mode, error_class, message):
    wf = BadFanOut.start(mode=mode)

    row = run_next(wf)

    assert (row.status, row.outcome, row.fan_out_total) == ("failed", "failed", None)
    assert row.error_class == error_class
    assert re.search(message, row.error_message), row.error_message
    assert not FanOutJob.objects.exists()
    assert wf.status == "paused"
    assert not WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="fan_out_started").exists()


def test_a_job_of_a_lambda_or_a_builtin_is_refused_where_it_is_made():
    with pytest.raises(ConfigurationError, match=r"must be a module-level function, not .*<lambda>"):
        Job(lambda: None)
    with pytest.raises(ConfigurationError, match="must be a plain function, got <built-in function len>"):
        Job(len, [1])


# -- step names ----------------------------------------------------------------------------------------


def test_resume_at_an_unknown_step_lists_the_steps_and_changes_nothing(order):
    wf = BadTwo.start(order)
    wf.pause(reason="look first")
    with changes_nothing(), pytest.raises(StepNotDefined, match=r"Step 'nope' is not defined in bad_two\. Available"):
        wf.resume_at("nope")
    with changes_nothing(), pytest.raises(StepNotDefined, match="Available steps: first, second"):
        operator.resume_at(wf.record.pk, "")


def test_resume_at_a_gravestone_is_refused_like_an_unknown_step(order):
    wf = BadGrave.start(order)
    wf.pause()
    with changes_nothing(), pytest.raises(StepNotDefined, match="Step 'old' is not defined in bad_grave"):
        wf.resume_at("old")


def test_resume_at_on_a_run_that_is_not_paused_says_so_before_looking_at_the_step(order):
    wf = BadTwo.start(order)
    with changes_nothing(), pytest.raises(NotPaused, match="Cannot resume_at a ready workflow: it is not paused"):
        wf.resume_at("nope")


def test_a_row_naming_an_unknown_step_pauses_the_run_with_step_not_defined(order):
    wf = BadTwo.start(order)
    ghost = reschedule_as(wf, "ghost")

    row = run_next(wf)

    assert row.pk == ghost.pk
    assert (row.status, row.outcome) == ("failed", "failed")
    assert row.error_class == "pgbus_workflows.exceptions.StepNotDefined"
    assert "Step 'ghost' is not defined in bad_two" in row.error_message
    assert wf.status == "paused"
    # It has no place in the class: resume and skip cannot go on from it, resume_at can.
    with changes_nothing(), pytest.raises(StepNotDefined, match=r"its step 'ghost' is not defined.*resume_at"):
        wf.resume()
    with changes_nothing(), pytest.raises(StepNotDefined, match=r"its step 'ghost' is not defined.*no next step"):
        wf.skip()
    wf.resume_at("second", reason="past the ghost")
    assert wf.status == "ready" and wf.current_step == "second"


def test_fan_out_results_of_an_unknown_step_raises(order):
    wf = BadFanOut.start(mode="non_job")
    with pytest.raises(StepNotDefined, match="Step 'nope' is not defined in bad_fan_out"):
        wf.fan_out_results("nope")


# -- a removed step still in flight ---------------------------------------------------------------------------


def test_a_removed_step_in_flight_is_counted_then_skipped_and_the_run_goes_on(order):
    wf = BadGrave.start(order)
    assert BadGrave.removed_steps_in_flight() == {"old": 0}
    run_next(wf)  # first: the next live step is "last"
    parked = reschedule_as(wf, "old")  # as a run scheduled on "old" before the deploy that removed it
    assert BadGrave.removed_steps_in_flight() == {"old": 1}

    row = run_next(wf)

    assert row.pk == parked.pk
    assert (row.status, row.outcome) == ("skipped", "skipped")
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, step=row, kind="step_skipped")
    assert event.details["removed"] is True and event.details["next_step"] == "last"
    assert BadGrave.removed_steps_in_flight() == {"old": 0}
    assert wf.status == "ready" and wf.current_step == "last"
    helpers.speedrun_workflow(wf)
    assert wf.status == "finished"


# -- a workflow class deleted while runs exist ------------------------------------------------------------------


@contextmanager
def class_deleted(cls: type[Workflow]) -> Iterator[None]:
    registry.unregister(cls.name)
    try:
        yield
    finally:
        registry.register(cls)


def test_a_run_whose_class_was_deleted_loads_bare_pauses_can_be_cancelled_and_not_rerun(order):
    wf = BadGone.start(order)
    run_next(wf)  # "one" done, "two" scheduled
    with class_deleted(BadGone):
        handle = Workflow.find(wf.workflow_id)
        assert type(handle) is Workflow and handle.status == "ready" and handle.current_step == "two"
        assert BadGone.find(wf.workflow_id) is None  # the class's own finder no longer claims it

        assert claim_due_steps(10) == []  # dispatchers leave it for code that has the class
        claimed = claim_step(WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled").pk)
        execute_step(claimed)

        handle.reload()
        row = WorkflowStep.objects.get(pk=claimed.pk)
        assert handle.status == "paused"
        assert (row.status, row.outcome) == ("failed", "failed")
        assert row.error_class == "pgbus_workflows.exceptions.StepNotDefined"
        assert "the class is not registered" in row.error_message
        with changes_nothing(), pytest.raises(StepNotDefined, match="its step 'two' is not defined in bad_gone"):
            handle.resume()
        with changes_nothing(), pytest.raises(StepNotDefined, match="Available steps: none"):
            handle.resume_at("two")

        handle.cancel(actor="ops", reason="its code is gone")
        assert handle.reload().status == "cancelled"
        assert not WorkflowStep.objects.filter(run_id=handle.record.pk, status__in=["scheduled", "waiting"]).exists()

        with changes_nothing(), pytest.raises(InvalidTransition, match="workflow class 'bad_gone' is not registered"):
            handle.rerun()
    assert registry.get("bad_gone") is BadGone


def test_rerun_of_a_run_whose_subject_was_deleted_is_refused_and_writes_nothing(order):
    wf = finished_run(order)
    pk = order.pk
    order.delete()
    with changes_nothing(), pytest.raises(InvalidTransition, match=f"its subject testapp.order {pk} no longer exists"):
        wf.rerun()


def test_rerun_of_an_ongoing_run_is_refused_and_writes_nothing(order):
    wf = BadTwo.start(order)
    with changes_nothing(), pytest.raises(InvalidTransition, match=r"Cannot rerun a ready workflow.*cancel it first"):
        wf.rerun()
    wf.pause()
    with changes_nothing(), pytest.raises(InvalidTransition, match=r"Cannot rerun a paused workflow.*resume it"):
        wf.rerun()


# -- Workflow.find ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["not-a-uuid", "", "1234", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", None, 3.5, [1]])
def test_find_with_a_malformed_id_returns_none(order, bad):
    BadTwo.start(order)
    assert Workflow.find(bad) is None
    assert BadTwo.find(bad) is None
    assert WorkflowRun.objects.count() == 1  # the connection is still usable


def test_find_of_an_unknown_id_or_of_another_class_returns_none(order):
    wf = BadTwo.start(order)
    assert Workflow.find(uuid.uuid4()) is None
    assert BadOne.find(wf.workflow_id) is None
    assert type(Workflow.find(str(wf.workflow_id))) is BadTwo


# -- operator verbs on rows that are gone, and executor calls out of turn --------------------------------------------


def test_a_verb_on_a_deleted_run_raises_does_not_exist(order):
    wf = BadTwo.start(order)
    WorkflowRun.objects.filter(pk=wf.record.pk).delete()
    for verb in ("pause", "cancel", "resume", "skip", "run_now"):
        with changes_nothing(), pytest.raises(WorkflowRun.DoesNotExist):
            getattr(wf, verb)()
    with changes_nothing(), pytest.raises(WorkflowRun.DoesNotExist):
        wf.signal("go")


def test_executing_a_step_that_was_never_claimed_runs_nothing(order):
    wf = BadOne.start(order)
    scheduled = WorkflowStep.objects.get(run_id=wf.record.pk)
    with changes_nothing():
        assert execute_step(scheduled) is None
        assert claim_step(987654) is None
        assert claim_due_steps(0) == []


# -- the admin's forms -----------------------------------------------------------------------------------------------


def waiting_run(order: Order) -> Workflow:
    wf = BadWaits.start(order)
    run_next(wf)
    assert wf.status == "waiting"
    return wf


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"name": "go", "payload": "{oops", "reason": "x"}, "payload", "This is not valid JSON"),
        ({"name": "go", "payload": "{'single': 1}", "reason": "x"}, "payload", "This is not valid JSON"),
        ({"name": "", "payload": "{}", "reason": "x"}, "name", "This field is required."),
        ({"name": "   ", "payload": "{}", "reason": "x"}, "name", "is not one of the available choices"),
        ({"name": "go", "payload": "{}", "reason": ""}, "reason", "This field is required."),
        ({"name": "g" * 256, "payload": "", "reason": "x"}, "name", "is not one of the available choices"),
        ({"name": "og", "payload": "", "reason": "x"}, "name", "og is not one of the available choices"),
    ],
    ids=["broken_json", "python_not_json", "empty_name", "blank_name", "no_reason", "long_name", "typo"],
)
def test_admin_signal_form_with_bad_input_shows_a_form_error_and_changes_nothing(
    admin_client, order, data, field, message
):
    wf = waiting_run(order)
    with changes_nothing():
        response = admin_client.post(operation_url(wf, "signal"), data)
    assert response.status_code == 200
    assert message in " ".join(response.context["form"].errors[field])
    assert wf.reload().status == "waiting"


def test_admin_signal_with_an_oversize_payload_is_a_form_error_and_changes_nothing(admin_client, order):
    wf = waiting_run(order)
    data = {"name": "go", "payload": f'{{"blob": "{BIG}"}}', "reason": "x"}
    with changes_nothing():
        response = admin_client.post(operation_url(wf, "signal"), data)
    assert response.status_code == 200
    (text,) = response.context["form"].errors["payload"]
    assert "The payload is" in text and f"over MAX_PAYLOAD_SIZE ({LIMIT} bytes)" in text


@pytest.mark.parametrize("payload", ["NaN", "[Infinity]", '{"n": -Infinity}'])
def test_admin_signal_with_a_payload_python_reads_but_json_forbids_warns_and_changes_nothing(
    admin_client, order, payload
):
    wf = waiting_run(order)
    with changes_nothing():
        response = admin_client.post(operation_url(wf, "signal"), {"name": "go", "payload": payload, "reason": "x"})
    assert response.status_code in (200, 302)
    if response.status_code == 200:  # refused by the form
        assert response.context["form"].errors["payload"]
    else:  # refused by the verb
        ((level, text),) = messages_of(response)
        assert level == WARNING and "signal 'go' payload must be JSON-serialisable" in text


def test_admin_signal_to_a_finished_run_warns_and_changes_nothing(admin_client, order):
    wf = finished_run(order)
    with changes_nothing():
        response = admin_client.post(operation_url(wf, "signal"), {"name": "go", "payload": "", "reason": "x"})
    assert response.status_code == 302
    ((level, text),) = messages_of(response)
    assert level == WARNING and "Cannot signal a finished workflow" in text


def test_admin_resume_at_a_step_that_does_not_exist_is_a_form_error_and_changes_nothing(admin_client, order):
    wf = BadTwo.start(order)
    wf.pause(reason="look first")
    for bad in ("nope", "old", ""):
        with changes_nothing():
            response = admin_client.post(operation_url(wf, "resume_at"), {"step": bad, "reason": "x"})
        assert response.status_code == 200
        errors = " ".join(response.context["form"].errors["step"])
        assert "Select a valid choice" in errors or "This field is required." in errors
    assert wf.reload().status == "paused"


def test_admin_resume_at_on_a_run_that_is_no_longer_paused_warns_and_changes_nothing(admin_client, order):
    wf = BadTwo.start(order)
    with changes_nothing():
        response = admin_client.post(operation_url(wf, "resume_at"), {"step": "second", "reason": "x"})
    assert response.status_code == 302
    ((level, text),) = messages_of(response)
    assert level == WARNING and "Cannot resume_at a ready workflow: it is not paused" in text


def test_admin_resume_at_for_a_run_whose_class_was_deleted_offers_no_step(admin_client, order):
    wf = BadGone.start(order)
    wf.pause()
    with class_deleted(BadGone):
        response = admin_client.get(operation_url(wf, "resume_at"))
        assert list(response.context["form"].fields["step"].choices) == []
        with changes_nothing():
            response = admin_client.post(operation_url(wf, "resume_at"), {"step": "one", "reason": "x"})
        assert response.status_code == 200 and response.context["form"].errors["step"]


def test_admin_operation_on_a_malformed_run_id_redirects_with_a_warning(admin_client):
    url = reverse("admin:pgbus_workflows_workflowrun_pause", args=["not-a-number"])
    with changes_nothing():
        response = admin_client.post(url, {"reason": "x"})
    assert response.status_code == 302
    ((level, text),) = messages_of(response)
    assert level == WARNING and "not-a-number" in text
