"""``wait_timeout=`` as a deadline per run: a callable of the workflow or the name of one of its methods.

The deadline is computed as the step parks (not before: a pending signal needs none), stored
as the attempt's ``timeout_at`` and timed out by the sweep like a fixed one; a value it cannot
take is the step's error, named.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from pgbus_workflows import ConfigurationError, Workflow, step
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.executor import run_due_steps
from tests.support import CLOCK_SLACK, events_of, record
from tests.testapp.models import Order

Q = "deadline_q"
CALLS: list[str] = []


def days_given(workflow) -> timedelta:
    """A deadline from the run's own arguments."""
    CALLS.append(str(workflow.workflow_id))
    return timedelta(days=workflow.arguments["days"])


class DeadlineFromArguments(Workflow):
    name = "deadline_from_arguments"
    step_options = {"queue": Q}

    @step(wait_for="confirmed", wait_timeout=days_given, on_timeout="cancel")
    def confirm(self):
        record("confirm")


class DeadlineFromMethod(Workflow):
    name = "deadline_from_method"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout="pay_by")
    def capture(self):
        record("capture")

    def pay_by(self):
        """An absolute deadline, or none at all for a run that asks for none."""
        text = self.arguments.get("pay_by")
        return None if text is None else datetime.fromisoformat(text)


class DeadlineBadValue(Workflow):
    name = "deadline_bad_value"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout=lambda wf: wf.arguments["value"])
    def capture(self):
        record("capture")


class DeadlineNotFinite(Workflow):
    """A deadline of a float JSON cannot carry (NaN, infinity) or one past what a datetime holds."""

    name = "deadline_not_finite"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout=lambda wf: float(wf.arguments["value"]))
    def capture(self):
        record("capture")


class DeadlineRaises(Workflow):
    name = "deadline_raises"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout="deadline")
    def capture(self):
        record("capture")

    def deadline(self):
        raise LookupError("no contract for this customer")


def run_all() -> int:
    return run_due_steps(queues=[Q])


def attempt(wf, name: str) -> WorkflowStep:
    return WorkflowStep.objects.filter(run_id=wf.record.pk, step_name=name).order_by("-pk").first()


@pytest.fixture(autouse=True)
def _no_calls():
    CALLS.clear()


@pytest.mark.django_db
def test_each_run_waits_until_the_deadline_its_arguments_give():
    short = DeadlineFromArguments.start(Order.objects.create(), days=1)
    long = DeadlineFromArguments.start(Order.objects.create(), days=30)
    before = timezone.now()
    run_all()

    for wf, days in ((short, 1), (long, 30)):
        row = attempt(wf, "confirm")
        assert (wf.reload().status, row.status) == ("waiting", "waiting")
        assert row.timeout_at == row.waiting_since + timedelta(days=days)
        assert before - CLOCK_SLACK <= row.waiting_since
        assert events_of(wf, "step_waiting")[-1].details["timeout_at"] == row.timeout_at.isoformat()
    assert sorted(CALLS) == sorted([str(short.workflow_id), str(long.workflow_id)])


@pytest.mark.django_db
def test_a_computed_deadline_times_out_as_a_fixed_one_does():
    short = DeadlineFromArguments.start(Order.objects.create(), days=1)
    long = DeadlineFromArguments.start(Order.objects.create(), days=30)
    run_all()

    summary = Sweeper().run(timezone.now() + timedelta(days=2))

    assert summary["wait_timeouts"] == 1
    assert short.reload().status == "cancelled"
    assert long.reload().status == "waiting"
    assert "wait_timed_out" in [e.kind for e in events_of(short)]


@pytest.mark.django_db
def test_a_method_name_may_give_an_aware_datetime_or_no_deadline():
    pay_by = datetime(2031, 5, 1, 12, tzinfo=UTC)
    dated = DeadlineFromMethod.start(Order.objects.create(), pay_by=pay_by.isoformat())
    open_ended = DeadlineFromMethod.start(Order.objects.create())
    run_all()

    assert attempt(dated, "capture").timeout_at == pay_by
    assert attempt(open_ended, "capture").timeout_at is None
    assert open_ended.reload().status == dated.reload().status == "waiting"


@pytest.mark.django_db
def test_the_deadline_is_not_computed_when_a_signal_is_already_pending():
    wf = DeadlineFromArguments.start(Order.objects.create(), days=1)
    wf.signal("confirmed")
    run_all()

    assert wf.reload().status == "finished"
    assert attempt(wf, "confirm").timeout_at is None
    assert CALLS == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("tomorrow", "returned 'tomorrow': a timedelta, a number of seconds"),
        (-5, "returned -5: a timedelta, a number of seconds (finite, not negative"),
        (True, "returned True"),
        ("2031-05-01T12:00:00", "returned '2031-05-01T12:00:00'"),
    ],
)
def test_a_value_that_is_no_deadline_is_the_steps_error_named(value, said):
    wf = DeadlineBadValue.start(Order.objects.create(), value=value)
    run_all()

    row = attempt(wf, "capture")
    assert row.status == "failed"
    assert row.error_class == "TypeError"
    assert row.error_message.startswith("DeadlineBadValue.capture: wait_timeout ")
    assert said in row.error_message
    assert wf.reload().status == "paused"  # the default policy, as for any step's error
    assert row.wait_for is None


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["nan", "inf", "1e300", "1e13"])
def test_a_deadline_of_no_finite_time_is_a_type_error_naming_the_class_and_step(value):
    wf = DeadlineNotFinite.start(Order.objects.create(), value=value)
    run_all()

    row = attempt(wf, "capture")
    assert (row.status, row.error_class) == ("failed", "TypeError")
    assert row.error_message.startswith(f"DeadlineNotFinite.capture: wait_timeout returned {float(value)!r}")
    assert wf.reload().status == "paused"


@pytest.mark.django_db
def test_a_naive_datetime_is_refused_with_its_reason():
    wf = DeadlineFromMethod.start(Order.objects.create(), pay_by="2031-05-01T12:00:00")
    run_all()

    row = attempt(wf, "capture")
    assert row.error_class == "TypeError"
    assert "DeadlineFromMethod.capture: wait_timeout returned a naive datetime" in row.error_message


@pytest.mark.django_db
def test_a_deadline_method_that_raises_is_the_steps_error():
    wf = DeadlineRaises.start(Order.objects.create())
    run_all()

    row = attempt(wf, "capture")
    assert (row.status, row.error_class, row.error_message) == (
        "failed",
        "LookupError",
        "no contract for this customer",
    )
    assert wf.reload().status == "paused"


def test_a_method_name_that_names_no_method_is_refused_with_the_class():
    with pytest.raises(ConfigurationError, match=r"\.capture: wait_timeout='pay_later' names no method of the class"):

        class NoSuchMethod(Workflow):
            name = "deadline_no_such_method"

            @step(wait_for="paid", wait_timeout="pay_later")
            def capture(self):
                pass


def test_an_async_deadline_is_refused():
    with pytest.raises(ConfigurationError, match=r"wait_timeout must not be an async def"):

        class AsyncDeadline(Workflow):
            name = "deadline_async"

            @step(wait_for="paid", wait_timeout="pay_by")
            def capture(self):
                pass

            async def pay_by(self):
                return timedelta(days=1)


def test_an_empty_method_name_is_refused():
    with pytest.raises(ConfigurationError, match=r"wait_timeout must be a duration, a callable or a method name"):

        @step(wait_for="paid", wait_timeout="")
        def capture(self):
            pass
