"""Signals and waiting steps (issue 4): wait_for, signal(), signal_for(), wait timeouts, operators.

Every test asserts on the rows (runs, step attempts, events, signals) and on the exceptions.
Timeouts are made to pass by moving ``timeout_at`` into the past with a queryset update, or by
giving ``expire_due_waits`` a later ``now``; one test waits for a real 1-second timeout.
"""

import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone

from pgbus_workflows import (
    InvalidTransition,
    NotOngoing,
    OnException,
    PayloadNotSerializable,
    PayloadTooLarge,
    StepWaiting,
    Workflow,
    step,
)
from pgbus_workflows import signals as wf_signals
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.exceptions import TestHelperError
from pgbus_workflows.models import WorkflowSignal, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step, run_due_steps
from pgbus_workflows.services.signals import deliver_signal
from pgbus_workflows.services.stuck import gauge
from pgbus_workflows.services.timeouts import expire_due_waits
from pgbus_workflows.testing import WorkflowTestMixin
from tests.procs import eventually
from tests.support import CLOCK_SLACK, events_of, kinds, labels, record, snapshot, steps_of
from tests.testapp.models import Order, SideEffect

Q = "sig_q"
HOUR = timedelta(hours=1)


def signal_info(workflow) -> dict:
    """What a wait_for body saw: returned as its output, so the step row keeps it."""
    received = workflow.received_signal
    return {
        "timed_out": workflow.timed_out,
        "signal": None
        if received is None
        else {
            "id": received.pk,
            "name": received.name,
            "payload": received.payload,
            "actor": received.actor,
            "received_at": received.received_at.isoformat(),
        },
    }


# -- workflows ----------------------------------------------------------------------------------


class SigPay(Workflow):
    name = "sig_pay"
    step_options = {"queue": Q}
    extra_signals = ["refunded", "note"]  # accepted though no step waits for them

    @step
    def prepare(self):
        record("prepare")

    @step(wait_for="paid")
    def capture(self):
        record("capture")
        return signal_info(self)

    @step
    def ship(self):
        record("ship")


class SigTimeoutPause(Workflow):
    name = "sig_timeout_pause"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout=HOUR)
    def capture(self):
        record("capture")
        return signal_info(self)

    @step
    def after(self):
        record("after")


class SigTimeoutCancel(Workflow):
    name = "sig_timeout_cancel"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout=HOUR, on_timeout="cancel")
    def capture(self):
        record("capture")
        return signal_info(self)

    @step
    def after(self):
        record("after")


class SigTimeoutSkip(Workflow):
    name = "sig_timeout_skip"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout=HOUR, on_timeout="skip")
    def capture(self):
        record("capture")
        return signal_info(self)

    @step
    def after(self):
        record("after")


class SigTimeoutRun(Workflow):
    name = "sig_timeout_run"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout=HOUR, on_timeout="run")
    def capture(self):
        record("capture")
        return signal_info(self)

    @step
    def after(self):
        record("after")


class SigOneSecond(Workflow):
    name = "sig_one_second"
    step_options = {"queue": Q}

    @step(wait_for="paid", wait_timeout=timedelta(seconds=1), on_timeout="run")
    def capture(self):
        record("capture")
        return signal_info(self)


class SigAnyOf(Workflow):
    name = "sig_any_of"
    step_options = {"queue": Q}

    @step(wait_for=["card", "cash"])
    def pay(self):
        record("pay")
        return signal_info(self)

    @step
    def done(self):
        record("done")


class SigTwice(Workflow):
    name = "sig_twice"
    step_options = {"queue": Q}

    @step(wait_for="go")
    def first(self):
        record("first")
        return signal_info(self)

    @step(wait_for="go")
    def second(self):
        record("second")
        return signal_info(self)


class SigLater(Workflow):
    """A signal for the second wait arrives while the first waits: it waits for its step."""

    name = "sig_later"
    step_options = {"queue": Q}

    @step(wait_for="approved")
    def approve(self):
        record("approve")
        return signal_info(self)

    @step(wait_for="shipped")
    def deliver(self):
        record("deliver")
        return signal_info(self)


class SigFlakyCapture(Workflow):
    """The signals guide's `capture` step: a wait_for body charging with its signal, reattempting a lost connection."""

    name = "sig_flaky_capture"
    step_options = {"queue": Q}
    exception_policies = [OnException(ConnectionError, action="reattempt", max_reattempts=3)]

    @step(wait_for="paid", wait_timeout=HOUR, on_timeout="cancel")
    def capture(self):
        record(f"capture {self.attempt}")
        if self.attempt == 1:
            raise ConnectionError("payment gateway unreachable")
        return signal_info(self)


class SigMultiple(Workflow):
    name = "sig_multiple"
    allow_multiple = True
    step_options = {"queue": Q}

    @step(wait_for="paid")
    def capture(self):
        record("capture")


# -- helpers ------------------------------------------------------------------------------------


def run_all() -> int:
    return run_due_steps(queues=[Q])


def step_row(wf, name: str) -> WorkflowStep:
    """The latest attempt of ``name``."""
    return WorkflowStep.objects.filter(run_id=wf.record.pk, step_name=name).order_by("-pk").first()


def park(cls, subject, **arguments):
    """Start a run and run its due steps until it waits."""
    wf = cls.start(subject, **arguments)
    run_all()
    wf.reload()
    assert wf.status == "waiting", wf.status
    return wf


def overdue(wf) -> None:
    """Move the waiting step's timeout into the past."""
    updated = WorkflowStep.objects.filter(run_id=wf.record.pk, status="waiting").update(
        timeout_at=timezone.now() - timedelta(seconds=1)
    )
    assert updated == 1


@pytest.fixture
def other_order(db):
    return Order.objects.create()


# -- (1) wait_for: consume a pending signal, or park ------------------------------------------------


@pytest.mark.django_db
def test_a_wait_for_step_parks_when_no_signal_is_pending(order):
    wf = SigPay.start(order)

    assert run_all() == 2  # prepare ran; capture was claimed and parked

    wf.reload()
    assert (wf.status, wf.current_step) == ("waiting", "capture")
    capture = step_row(wf, "capture")
    assert capture.status == "waiting"
    assert capture.wait_for == ["paid"]
    assert capture.waiting_since is not None
    assert capture.timeout_at is None
    assert capture.stall_at is None
    assert capture.signal_id is None
    assert labels() == ["prepare"]  # the body did not run
    waiting = events_of(wf)[-1]
    assert waiting.kind == "step_waiting"
    assert waiting.step_id == capture.pk
    assert (waiting.transition, waiting.from_status, waiting.to_status) == ("park", "performing", "waiting")
    assert waiting.details == {"wait_for": ["paid"], "timeout_at": None}


@pytest.mark.django_db
def test_a_parked_step_with_a_wait_timeout_records_its_deadline(order):
    wf = park(SigTimeoutPause, order)

    capture = step_row(wf, "capture")
    assert capture.status == "waiting"
    assert capture.timeout_at == capture.waiting_since + HOUR
    waiting = events_of(wf)[-1]
    assert waiting.kind == "step_waiting"
    assert waiting.details == {"wait_for": ["paid"], "timeout_at": capture.timeout_at.isoformat()}


@pytest.mark.django_db
def test_a_pending_signal_is_consumed_at_once_when_the_step_comes_up(order):
    wf = SigPay.start(order)
    signal = wf.signal("paid", {"amount": 42}, actor="stripe")

    # prepare is scheduled, nothing waits: the signal waits for its step
    assert wf.status == "ready"
    signal.refresh_from_db()
    assert (signal.status, signal.consumed_by_id) == ("pending", None)

    assert run_all() == 3

    wf.reload()
    assert wf.status == "finished"
    capture = step_row(wf, "capture")
    signal.refresh_from_db()
    assert (signal.status, signal.consumed_by_id) == ("consumed", capture.pk)
    assert signal.consumed_at is not None
    assert capture.signal_id == signal.pk
    assert (capture.status, capture.outcome, capture.timed_out) == ("completed", "success", False)
    assert capture.output["signal"]["id"] == signal.pk
    assert capture.output["signal"]["payload"] == {"amount": 42}
    assert labels() == ["prepare", "capture", "ship"]
    assert "step_waiting" not in kinds(wf)
    consumed = [e for e in events_of(wf) if e.kind == "signal_consumed"]
    assert len(consumed) == 1
    assert consumed[0].step_id == capture.pk
    assert consumed[0].details == {"signal": "paid", "signal_id": signal.pk}


@pytest.mark.django_db
def test_a_matching_signal_wakes_the_waiting_step(order):
    wf = park(SigPay, order)
    capture = step_row(wf, "capture")
    before = len(events_of(wf))

    signal = wf.signal("paid", {"amount": 42}, actor="stripe", reason="webhook evt_1")

    assert isinstance(signal, WorkflowSignal)
    assert signal.duplicate_delivery is False
    assert wf.status == "ready"  # the handle was reloaded
    signal.refresh_from_db()
    assert (signal.name, signal.payload, signal.actor, signal.reason) == (
        "paid",
        {"amount": 42},
        "stripe",
        "webhook evt_1",
    )
    assert (signal.status, signal.consumed_by_id) == ("consumed", capture.pk)
    capture.refresh_from_db()
    assert (capture.status, capture.signal_id, capture.timed_out) == ("scheduled", signal.pk, False)
    assert capture.scheduled_at <= timezone.now() + CLOCK_SLACK
    new = events_of(wf)[before:]
    assert [e.kind for e in new] == ["signal_received", "signal_consumed", "step_woken"]
    assert (new[0].actor, new[0].reason, new[0].details) == (
        "stripe",
        "webhook evt_1",
        {"signal": "paid", "signal_id": signal.pk},
    )
    woken = new[2]
    assert (woken.transition, woken.from_status, woken.to_status, woken.actor) == ("wake", "waiting", "ready", "stripe")
    assert woken.step_id == capture.pk

    assert run_all() == 2

    wf.reload()
    assert wf.status == "finished"
    capture.refresh_from_db()
    assert capture.output == {
        "timed_out": False,
        "signal": {
            "id": signal.pk,
            "name": "paid",
            "payload": {"amount": 42},
            "actor": "stripe",
            "received_at": signal.received_at.isoformat(),
        },
    }
    assert labels() == ["prepare", "capture", "ship"]
    assert [(s.step_name, s.attempt, s.status) for s in steps_of(wf)] == [
        ("prepare", 1, "completed"),
        ("capture", 1, "completed"),
        ("ship", 1, "completed"),
    ]


@pytest.mark.django_db
def test_a_signal_with_no_payload_is_stored_as_an_empty_object(order):
    wf = park(SigPay, order)

    signal = wf.signal("paid")

    signal.refresh_from_db()
    assert signal.payload == {}
    assert signal.status == "consumed"
    run_all()
    assert step_row(wf, "capture").output["signal"]["payload"] == {}


@pytest.mark.django_db
def test_a_signal_no_step_waits_for_stays_pending(order):
    wf = park(SigPay, order)
    capture = step_row(wf, "capture")

    other = wf.signal("refunded", {"why": "late"})

    assert wf.status == "waiting"
    other.refresh_from_db()
    assert (other.status, other.consumed_by_id) == ("pending", None)
    capture.refresh_from_db()
    assert (capture.status, capture.signal_id) == ("waiting", None)
    assert kinds(wf)[-1] == "signal_received"
    assert run_all() == 0

    wf.signal("paid")
    run_all()
    assert wf.reload().status == "finished"
    other.refresh_from_db()
    assert other.status == "pending"  # still nobody's


@pytest.mark.django_db
def test_a_signal_for_a_later_step_waits_for_that_step(order):
    wf = park(SigLater, order)

    shipped = wf.signal("shipped", {"carrier": "ups"})
    assert wf.status == "waiting"
    assert step_row(wf, "approve").status == "waiting"

    approved = wf.signal("approved")
    assert run_all() == 2  # approve ran; deliver came up and consumed the pending signal at once

    wf.reload()
    assert wf.status == "finished"
    approve, deliver = step_row(wf, "approve"), step_row(wf, "deliver")
    shipped.refresh_from_db()
    approved.refresh_from_db()
    assert (approved.status, approved.consumed_by_id) == ("consumed", approve.pk)
    assert (shipped.status, shipped.consumed_by_id) == ("consumed", deliver.pk)
    assert deliver.output["signal"]["payload"] == {"carrier": "ups"}
    assert [e.step_id for e in events_of(wf) if e.kind == "step_waiting"] == [approve.pk]


@pytest.mark.django_db
def test_pending_signals_are_consumed_once_each_oldest_first(order):
    wf = SigTwice.start(order)
    one = wf.signal("go", {"n": 1})
    two = wf.signal("go", {"n": 2})
    three = wf.signal("go", {"n": 3})

    assert run_all() == 2

    wf.reload()
    assert wf.status == "finished"
    first, second = step_row(wf, "first"), step_row(wf, "second")
    for signal in (one, two, three):
        signal.refresh_from_db()
    assert (one.status, one.consumed_by_id) == ("consumed", first.pk)
    assert (two.status, two.consumed_by_id) == ("consumed", second.pk)
    assert (three.status, three.consumed_by_id) == ("pending", None)
    assert first.output["signal"]["payload"] == {"n": 1}
    assert second.output["signal"]["payload"] == {"n": 2}


@pytest.mark.django_db
def test_wait_for_a_list_is_woken_by_either_name(order):
    wf = park(SigAnyOf, order)
    pay = step_row(wf, "pay")
    assert pay.wait_for == ["card", "cash"]
    assert events_of(wf)[-1].details["wait_for"] == ["card", "cash"]

    cash = wf.signal("cash", {"eur": 10})
    card = wf.signal("card", {"eur": 10})  # arrives second: the step is no longer waiting

    cash.refresh_from_db()
    card.refresh_from_db()
    assert (cash.status, cash.consumed_by_id) == ("consumed", pay.pk)
    assert (card.status, card.consumed_by_id) == ("pending", None)
    run_all()
    assert wf.reload().status == "finished"
    assert step_row(wf, "pay").output["signal"]["name"] == "cash"


@pytest.mark.django_db
def test_wait_for_a_list_takes_the_first_pending_signal_to_arrive(order):
    wf = SigAnyOf.start(order)
    card = wf.signal("card")
    cash = wf.signal("cash")

    run_all()

    wf.reload()
    assert wf.status == "finished"
    pay = step_row(wf, "pay")
    card.refresh_from_db()
    cash.refresh_from_db()
    assert (card.status, card.consumed_by_id) == ("consumed", pay.pk)
    assert cash.status == "pending"
    assert pay.output["signal"]["name"] == "card"


# -- (2) signal(): idempotency, refusals, payloads, transactions ---------------------------------


@pytest.mark.django_db
def test_a_repeated_idempotency_key_returns_the_first_signal_and_moves_nothing(order):
    wf = park(SigPay, order)
    first = wf.signal("paid", {"amount": 42}, "evt_1", actor="stripe")
    assert wf.status == "ready"
    before = snapshot(wf)

    again = wf.signal("paid", {"amount": 99}, "evt_1", actor="stripe")

    assert again.duplicate_delivery is True
    assert first.duplicate_delivery is False
    assert again.pk == first.pk
    assert again.payload == {"amount": 42}
    assert snapshot(wf) == before
    assert WorkflowSignal.objects.filter(run_id=wf.record.pk).count() == 1


@pytest.mark.django_db
def test_a_duplicate_key_does_not_wake_a_waiting_step(order):
    """The first delivery was a name nobody waited for; its retry under the key of a waited name is a duplicate."""
    wf = park(SigPay, order)
    first = wf.signal("note", {"text": "hi"}, "evt_7")
    before = snapshot(wf)

    again = wf.signal("paid", {"amount": 1}, "evt_7")

    assert again.duplicate_delivery is True
    assert (again.pk, again.name) == (first.pk, "note")
    assert snapshot(wf) == before
    assert step_row(wf, "capture").status == "waiting"
    assert wf.reload().status == "waiting"


@pytest.mark.django_db
def test_the_same_key_on_another_run_is_another_signal(order, other_order):
    wf1 = park(SigPay, order)
    wf2 = park(SigPay, other_order)

    s1 = wf1.signal("paid", idempotency_key="evt_1")
    s2 = wf2.signal("paid", idempotency_key="evt_1")

    assert s1.pk != s2.pk
    assert not s1.duplicate_delivery and not s2.duplicate_delivery
    assert (wf1.status, wf2.status) == ("ready", "ready")


@pytest.mark.django_db
def test_signalling_a_finished_run_raises_not_ongoing_and_writes_nothing(order):
    wf = park(SigPay, order)
    wf.signal("paid")
    run_all()
    assert wf.reload().status == "finished"
    before = snapshot(wf)

    with pytest.raises(NotOngoing, match="finished"):
        wf.signal("paid", idempotency_key="evt_late")
    with pytest.raises(NotOngoing):
        deliver_signal(wf.record.pk, "paid")

    assert snapshot(wf) == before
    assert issubclass(NotOngoing, InvalidTransition)


@pytest.mark.django_db
def test_signalling_a_cancelled_run_raises_not_ongoing_and_writes_nothing(order):
    wf = park(SigPay, order)
    wf.cancel(actor="bob")
    before = snapshot(wf)

    with pytest.raises(NotOngoing, match="cancelled"):
        wf.signal("paid")

    assert snapshot(wf) == before


@pytest.mark.django_db
def test_signal_for_signals_the_ongoing_run_of_the_subject(order):
    wf = park(SigPay, order)

    signal = SigPay.signal_for(order, "paid", {"amount": 5}, "evt_9", actor="stripe", reason="hook")

    assert signal.run_id == wf.record.pk
    signal.refresh_from_db()
    assert (signal.status, signal.idempotency_key, signal.actor, signal.reason) == (
        "consumed",
        "evt_9",
        "stripe",
        "hook",
    )
    assert wf.reload().status == "ready"
    again = SigPay.signal_for(order, "paid", {"amount": 5}, "evt_9")
    assert again.duplicate_delivery is True
    assert again.pk == signal.pk
    run_all()
    assert wf.reload().status == "finished"
    assert step_row(wf, "capture").output["signal"]["payload"] == {"amount": 5}


@pytest.mark.django_db
def test_signal_for_without_an_ongoing_run(order, other_order):
    wf = park(SigPay, order)
    park(SigAnyOf, other_order)  # another class's run is no match

    with pytest.raises(NotOngoing, match="no ongoing run"):
        SigPay.signal_for(other_order, "paid")
    assert SigPay.signal_for(other_order, "paid", missing="ignore") is None

    wf.cancel()
    with pytest.raises(NotOngoing):
        SigPay.signal_for(order, "paid")
    assert SigPay.signal_for(order, "paid", missing="ignore") is None

    assert WorkflowSignal.objects.count() == 0
    assert step_row(wf, "capture").status == "cancelled"


@pytest.mark.django_db
def test_signal_for_refuses_a_missing_subject_and_a_bad_missing_value(order):
    park(SigPay, order)

    with pytest.raises(ValueError, match="needs a subject"):
        SigPay.signal_for(None, "paid")
    with pytest.raises(ValueError, match="needs a subject"):
        SigPay.signal_for(None, "paid", missing="ignore")
    with pytest.raises(ValueError, match="missing must be 'raise' or 'ignore'"):
        SigPay.signal_for(order, "paid", missing="skip")

    assert WorkflowSignal.objects.count() == 0


@pytest.mark.django_db
def test_signal_for_with_several_ongoing_runs_is_refused(order):
    SigMultiple.start(order)
    SigMultiple.start(order)

    with pytest.raises(ValueError, match="several ongoing runs"):
        SigMultiple.signal_for(order, "paid")
    assert WorkflowSignal.objects.count() == 0


@pytest.mark.django_db
def test_a_payload_over_max_payload_size_is_refused_and_writes_nothing(order, settings):
    assert settings.PGBUS_WORKFLOWS["MAX_PAYLOAD_SIZE"] == 4096
    wf = park(SigPay, order)
    before = snapshot(wf)

    with pytest.raises(PayloadTooLarge, match="4096"):
        wf.signal("paid", {"blob": "x" * 5000})
    with pytest.raises(PayloadTooLarge):
        SigPay.signal_for(order, "paid", {"blob": "x" * 5000}, "evt_big")

    assert snapshot(wf) == before
    assert WorkflowSignal.objects.count() == 0

    fits = wf.signal("paid", {"blob": "x" * 4000})
    assert fits.status == "consumed"


@pytest.mark.django_db
def test_a_payload_that_is_not_json_is_refused_and_writes_nothing(order):
    wf = park(SigPay, order)
    before = snapshot(wf)

    with pytest.raises(PayloadNotSerializable):
        wf.signal("paid", {"when": object()})
    with pytest.raises(PayloadNotSerializable):
        wf.signal("paid", {1, 2})

    assert snapshot(wf) == before


@pytest.mark.django_db
def test_a_signal_inside_the_callers_transaction_commits_with_it(order):
    wf = park(SigPay, order)

    with transaction.atomic():
        SideEffect.objects.create(label="webhook")
        signal = wf.signal("paid", {"amount": 3}, "evt_tx")

    assert WorkflowSignal.objects.get().pk == signal.pk
    assert wf.reload().status == "ready"
    assert step_row(wf, "capture").status == "scheduled"
    assert labels() == ["prepare", "webhook"]


@pytest.mark.django_db
def test_a_rolled_back_webhook_leaves_no_signal_and_moves_nothing(order):
    wf = park(SigPay, order)
    before = snapshot(wf)

    class WebhookFailed(Exception):
        pass

    with pytest.raises(WebhookFailed), transaction.atomic():
        SideEffect.objects.create(label="webhook")
        wf.signal("paid", {"amount": 3}, "evt_tx")
        assert wf.status == "ready"  # inside the transaction the step was woken
        raise WebhookFailed

    assert snapshot(wf) == before
    assert WorkflowSignal.objects.count() == 0
    assert wf.reload().status == "waiting"
    assert run_all() == 0
    # the retry of the webhook is not a duplicate: the first delivery never happened
    retry = wf.signal("paid", {"amount": 3}, "evt_tx")
    assert retry.duplicate_delivery is False
    assert wf.status == "ready"


@pytest.mark.django_db
def test_a_bad_signal_name_is_refused(order):
    wf = park(SigPay, order)

    with pytest.raises(ValueError, match="signal name"):
        wf.signal("")
    with pytest.raises(ValueError, match="idempotency_key"):
        wf.signal("paid", idempotency_key="")
    assert WorkflowSignal.objects.count() == 0
    assert wf.reload().status == "waiting"


@pytest.mark.django_db
def test_the_handle_lists_the_runs_signals_oldest_first(order):
    wf = park(SigPay, order)
    note = wf.signal("note")
    paid = wf.signal("paid")

    assert [(s.pk, s.name, s.status) for s in wf.signals] == [
        (note.pk, "note", "pending"),
        (paid.pk, "paid", "consumed"),
    ]


# -- (4) wait timeouts ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_wait_that_is_not_due_does_not_time_out(order):
    wf = park(SigTimeoutPause, order)
    capture = step_row(wf, "capture")
    before = snapshot(wf)

    assert expire_due_waits() == 0
    assert expire_due_waits(capture.timeout_at) == 0  # due strictly after its deadline

    assert snapshot(wf) == before


@pytest.mark.django_db
def test_on_timeout_pause_fails_the_step_with_wait_timed_out_and_pauses_the_run(order):
    wf = park(SigTimeoutPause, order)
    overdue(wf)
    before = len(events_of(wf))

    assert expire_due_waits() == 1

    wf.reload()
    capture = step_row(wf, "capture")
    assert wf.status == "paused"
    assert (capture.status, capture.outcome, capture.timed_out) == ("failed", "failed", True)
    assert capture.error_class == "pgbus_workflows.exceptions.WaitTimedOut"
    assert re.match(r"capture waited for paid since .* and timed out at ", capture.error_message)
    assert "WaitTimedOut" in wf.record.paused_reason
    new = events_of(wf)[before:]
    assert [e.kind for e in new] == ["wait_timed_out", "step_resolved", "step_failed"]
    timed_out = new[0]
    assert timed_out.step_id == capture.pk
    assert timed_out.details == {
        "wait_for": ["paid"],
        "action": "pause",
        "timeout_at": capture.timeout_at.isoformat(),
    }
    assert (new[1].transition, new[1].from_status, new[1].to_status) == ("resolve", "waiting", "performing")
    assert (new[2].transition, new[2].to_status) == ("hold", "paused")
    assert labels() == []
    assert expire_due_waits() == 0  # fired once


@pytest.mark.django_db
def test_a_signal_after_a_pause_timeout_stays_pending_until_resume(order):
    wf = park(SigTimeoutPause, order)
    overdue(wf)
    expire_due_waits()

    late = wf.signal("paid", {"amount": 1})

    assert wf.status == "paused"
    late.refresh_from_db()
    assert late.status == "pending"
    assert run_all() == 0

    wf.resume(actor="alice")
    assert wf.status == "ready"
    assert run_all() == 2

    wf.reload()
    assert wf.status == "finished"
    assert [(s.step_name, s.attempt, s.status) for s in steps_of(wf)] == [
        ("capture", 1, "failed"),
        ("capture", 2, "completed"),
        ("after", 1, "completed"),
    ]
    late.refresh_from_db()
    assert (late.status, late.consumed_by_id) == ("consumed", step_row(wf, "capture").pk)
    assert step_row(wf, "capture").output["signal"]["payload"] == {"amount": 1}


@pytest.mark.django_db
def test_resume_after_a_pause_timeout_waits_again_with_a_new_deadline(order):
    wf = park(SigTimeoutPause, order)
    overdue(wf)
    expire_due_waits()
    first = step_row(wf, "capture")

    wf.resume()
    assert run_all() == 1

    wf.reload()
    assert wf.status == "waiting"
    second = step_row(wf, "capture")
    assert (second.attempt, second.status, second.timed_out) == (2, "waiting", False)
    assert second.timeout_at == second.waiting_since + HOUR
    assert second.timeout_at > first.timeout_at
    assert expire_due_waits() == 0
    assert labels() == []


@pytest.mark.django_db
def test_on_timeout_cancel_cancels_the_run(order):
    wf = park(SigTimeoutCancel, order)

    assert expire_due_waits(timezone.now() + 2 * HOUR) == 1  # a later now

    wf.reload()
    capture = step_row(wf, "capture")
    assert wf.status == "cancelled"
    assert (capture.status, capture.outcome, capture.timed_out) == ("cancelled", "cancelled", True)
    timed_out = next(e for e in events_of(wf) if e.kind == "wait_timed_out")
    assert timed_out.details["action"] == "cancel"
    assert kinds(wf)[-1] == "cancelled"
    assert labels() == []
    with pytest.raises(NotOngoing):
        wf.signal("paid")


@pytest.mark.django_db
def test_on_timeout_skip_skips_the_step_and_moves_on(order):
    wf = park(SigTimeoutSkip, order)
    overdue(wf)

    assert expire_due_waits() == 1

    wf.reload()
    assert (wf.status, wf.current_step) == ("ready", "after")
    capture = step_row(wf, "capture")
    assert (capture.status, capture.outcome, capture.timed_out) == ("skipped", "skipped", True)
    assert step_row(wf, "after").status == "scheduled"
    assert next(e for e in events_of(wf) if e.kind == "wait_timed_out").details["action"] == "skip"

    late = wf.signal("paid")
    assert late.status == "pending"
    assert run_all() == 1
    assert wf.reload().status == "finished"
    assert labels() == ["after"]
    late.refresh_from_db()
    assert late.status == "pending"


@pytest.mark.django_db
def test_on_timeout_run_runs_the_step_timed_out_and_a_late_signal_stays_pending(order):
    wf = park(SigTimeoutRun, order)
    overdue(wf)
    before = len(events_of(wf))

    assert expire_due_waits() == 1

    wf.reload()
    capture = step_row(wf, "capture")
    assert wf.status == "ready"
    assert (capture.status, capture.timed_out, capture.signal_id) == ("scheduled", True, None)
    new = events_of(wf)[before:]
    assert [e.kind for e in new] == ["wait_timed_out", "step_timed_out"]
    assert new[0].details["action"] == "run"
    assert (new[1].transition, new[1].from_status, new[1].to_status) == ("wake", "waiting", "ready")

    late = wf.signal("paid", {"amount": 7})
    late.refresh_from_db()
    assert late.status == "pending"

    assert run_all() == 2
    wf.reload()
    assert wf.status == "finished"
    capture.refresh_from_db()
    assert capture.output == {"timed_out": True, "signal": None}
    assert (capture.status, capture.attempt) == ("completed", 1)
    late.refresh_from_db()
    assert (late.status, late.consumed_by_id) == ("pending", None)
    assert labels() == ["capture", "after"]


@pytest.mark.django_db
def test_the_sweeper_applies_wait_timeouts(order):
    wf = park(SigTimeoutCancel, order)
    overdue(wf)

    summary = Sweeper().run()

    assert summary["wait_timeouts"] == 1
    assert wf.reload().status == "cancelled"
    assert "wait_timed_out" in kinds(wf)


@pytest.mark.django_db
def test_the_sweeper_with_a_later_now_times_out_the_wait(order):
    wf = park(SigTimeoutPause, order)

    assert Sweeper().run(timezone.now() + 2 * HOUR)["wait_timeouts"] == 1

    assert wf.reload().status == "paused"
    assert step_row(wf, "capture").error_class.endswith("WaitTimedOut")


@pytest.mark.django_db
def test_only_overdue_waits_time_out(order, other_order):
    late = park(SigTimeoutCancel, order)
    early = park(SigTimeoutCancel, other_order)
    overdue(late)

    assert expire_due_waits() == 1

    assert late.reload().status == "cancelled"
    assert early.reload().status == "waiting"
    assert "wait_timed_out" not in kinds(early)


@pytest.mark.django_db
def test_a_wait_without_a_timeout_never_times_out_nor_stalls(order):
    wf = park(SigPay, order)
    before = snapshot(wf)

    assert expire_due_waits(timezone.now() + timedelta(days=365)) == 0
    summary = Sweeper().run(timezone.now() + timedelta(days=2))

    assert (summary["wait_timeouts"], summary["stalled"]) == (0, 0)
    assert snapshot(wf) == before


@pytest.mark.django_db
def test_the_wait_timed_out_django_signal_is_sent_after_commit(order, django_capture_on_commit_callbacks):
    wf = park(SigTimeoutSkip, order)
    overdue(wf)
    received = []

    def receiver(sender, **kwargs):
        received.append((sender, kwargs))

    wf_signals.wait_timed_out.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            expire_due_waits()
    finally:
        wf_signals.wait_timed_out.disconnect(receiver)

    capture = step_row(wf, "capture")
    assert received == [
        (
            "sig_timeout_skip",
            {
                "signal": wf_signals.wait_timed_out,
                "workflow_id": wf.workflow_id,
                "step_name": "capture",
                "attempt": capture.attempt,
                "action": "skip",
            },
        )
    ]


@pytest.mark.django_db
def test_a_paused_runs_wait_does_not_time_out_until_resumed(order):
    wf = park(SigTimeoutSkip, order)
    wf.pause(actor="alice", reason="look first")
    overdue(wf)
    before = snapshot(wf)

    assert expire_due_waits() == 0
    assert expire_due_waits(timezone.now() + timedelta(days=30)) == 0
    assert snapshot(wf) == before

    wf.resume(actor="alice")
    assert wf.status == "waiting"
    assert step_row(wf, "capture").status == "waiting"

    assert expire_due_waits() == 1
    wf.reload()
    assert (wf.status, wf.current_step) == ("ready", "after")
    assert step_row(wf, "capture").status == "skipped"


@pytest.mark.django_db(transaction=True)
def test_a_real_one_second_wait_timeout_fires(order):
    wf = park(SigOneSecond, order)
    capture = step_row(wf, "capture")
    assert capture.timeout_at == capture.waiting_since + timedelta(seconds=1)
    assert expire_due_waits() == 0

    fired = eventually(expire_due_waits, timeout=10, interval=0.1, what="the one-second wait to expire")

    assert fired == 1
    assert timezone.now() > capture.timeout_at
    assert run_all() == 1
    assert wf.reload().status == "finished"
    assert step_row(wf, "capture").output == {"timed_out": True, "signal": None}


# -- (5) operators on a waiting run -----------------------------------------------------------------


@pytest.mark.django_db
def test_a_paused_waiting_run_holds_a_signal_until_resume(order):
    wf = park(SigPay, order)
    wf.pause(actor="alice", reason="fraud check")
    assert wf.status == "paused"
    assert step_row(wf, "capture").status == "waiting"
    paused = events_of(wf)[-1]
    assert (paused.kind, paused.transition, paused.from_status) == ("paused", "pause", "waiting")

    signal = wf.signal("paid", {"amount": 9})

    assert wf.status == "paused"
    signal.refresh_from_db()
    capture = step_row(wf, "capture")
    assert (signal.status, signal.consumed_by_id) == ("consumed", capture.pk)
    assert (capture.status, capture.signal_id) == ("scheduled", signal.pk)
    held = events_of(wf)[-1]
    assert (held.kind, held.transition, held.from_status, held.to_status) == (
        "step_woken",
        "hold",
        "paused",
        "paused",
    )
    assert run_all() == 0
    assert labels() == ["prepare"]

    wf.resume(actor="alice")
    assert wf.status == "ready"
    assert run_all() == 2
    assert wf.reload().status == "finished"
    assert step_row(wf, "capture").output["signal"]["payload"] == {"amount": 9}
    assert labels() == ["prepare", "capture", "ship"]


@pytest.mark.django_db
def test_a_step_that_parks_after_its_run_was_paused_keeps_the_run_paused(order):
    wf = SigPay.start(order)
    run_due_steps(limit=1, queues=[Q])  # prepare
    (claimed,) = claim_due_steps(1, queues=[Q])  # capture is claimed ...
    wf.pause(actor="alice")  # ... and the run paused before its gate runs

    assert execute_step(claimed) is None

    wf.reload()
    assert wf.status == "paused"
    assert step_row(wf, "capture").status == "waiting"
    held = events_of(wf)[-1]
    assert (held.kind, held.transition, held.from_status, held.to_status) == (
        "step_waiting",
        "hold",
        "paused",
        "paused",
    )
    wf.resume()
    assert wf.status == "waiting"
    wf.signal("paid")
    run_all()
    assert wf.reload().status == "finished"


@pytest.mark.django_db
def test_run_now_on_a_paused_waiting_run_runs_nothing_until_resume(order):
    wf = park(SigPay, order)
    wf.pause()

    wf.run_now(actor="alice")

    assert wf.status == "paused"
    capture = step_row(wf, "capture")
    assert (capture.status, capture.timed_out) == ("scheduled", True)
    assert run_all() == 0
    wf.resume()
    assert wf.status == "ready"
    run_all()
    assert wf.reload().status == "finished"
    assert step_row(wf, "capture").output == {"timed_out": True, "signal": None}


@pytest.mark.django_db
def test_resume_without_a_signal_goes_back_to_waiting(order):
    wf = park(SigPay, order)
    wf.pause()
    wf.resume(actor="alice")

    assert wf.status == "waiting"
    resumed = events_of(wf)[-1]
    assert (resumed.kind, resumed.transition, resumed.from_status, resumed.to_status) == (
        "resumed",
        "resume",
        "paused",
        "waiting",
    )
    assert step_row(wf, "capture").status == "waiting"
    assert run_all() == 0

    wf.signal("paid")
    assert wf.status == "ready"
    run_all()
    assert wf.reload().status == "finished"


@pytest.mark.django_db
def test_a_signal_while_paused_wakes_the_step_and_the_timeout_no_longer_fires(order):
    wf = park(SigTimeoutCancel, order)
    wf.pause()
    wf.signal("paid")
    overdue_rows = WorkflowStep.objects.filter(run_id=wf.record.pk).update(timeout_at=timezone.now() - HOUR)
    assert overdue_rows == 1
    wf.resume()

    assert wf.status == "ready"
    assert expire_due_waits() == 0
    run_all()
    assert wf.reload().status == "finished"
    assert "wait_timed_out" not in kinds(wf)


@pytest.mark.django_db
def test_run_now_on_a_waiting_step_runs_it_timed_out(order):
    wf = park(SigPay, order)

    wf.run_now(actor="alice", reason="do not wait")

    assert wf.status == "ready"
    capture = step_row(wf, "capture")
    assert (capture.status, capture.timed_out, capture.signal_id) == ("scheduled", True, None)
    run_now, woken = events_of(wf)[-2:]
    assert (run_now.kind, run_now.actor, run_now.reason) == ("run_now", "alice", "do not wait")
    assert (woken.transition, woken.from_status, woken.to_status) == ("wake", "waiting", "ready")

    assert run_all() == 2
    assert wf.reload().status == "finished"
    assert step_row(wf, "capture").output == {"timed_out": True, "signal": None}
    assert labels() == ["prepare", "capture", "ship"]


@pytest.mark.django_db
def test_skip_on_a_waiting_run_skips_the_step_and_schedules_the_next(order):
    wf = park(SigPay, order)

    wf.skip(actor="alice", reason="paid offline")

    assert (wf.status, wf.current_step) == ("ready", "ship")
    capture = step_row(wf, "capture")
    assert (capture.status, capture.outcome) == ("skipped", "skipped")
    assert step_row(wf, "ship").status == "scheduled"
    skipped = events_of(wf)[-1]
    assert (skipped.kind, skipped.actor, skipped.reason) == ("step_skipped", "alice", "paid offline")
    assert (skipped.transition, skipped.to_status) == ("advance", "ready")

    late = wf.signal("paid")
    assert late.status == "pending"
    assert run_all() == 1
    assert wf.reload().status == "finished"
    assert labels() == ["prepare", "ship"]


@pytest.mark.django_db
def test_skip_on_a_paused_waiting_run_resumes_it_at_the_next_step(order):
    wf = park(SigPay, order)
    wf.pause()

    wf.skip(actor="alice")

    assert (wf.status, wf.current_step) == ("ready", "ship")
    assert step_row(wf, "capture").status == "skipped"
    run_all()
    assert wf.reload().status == "finished"
    assert labels() == ["prepare", "ship"]


@pytest.mark.django_db
def test_cancel_on_a_waiting_run_cancels_the_waiting_step(order):
    wf = park(SigTimeoutPause, order)

    wf.cancel(actor="bob", reason="customer asked")

    assert wf.status == "cancelled"
    capture = step_row(wf, "capture")
    assert (capture.status, capture.outcome) == ("cancelled", "cancelled")
    cancelled = events_of(wf)[-1]
    assert (cancelled.kind, cancelled.transition, cancelled.from_status, cancelled.actor) == (
        "cancelled",
        "cancel",
        "waiting",
        "bob",
    )
    overdue_rows = WorkflowStep.objects.filter(run_id=wf.record.pk).update(timeout_at=timezone.now() - HOUR)
    assert overdue_rows == 1
    assert expire_due_waits() == 0
    with pytest.raises(NotOngoing):
        wf.signal("paid")
    assert WorkflowSignal.objects.count() == 0


# -- (6) the gauge ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_gauge_counts_long_waits_without_a_timeout(order, other_order):
    park(SigPay, order)  # no timeout
    park(SigTimeoutPause, other_order)  # a timeout: its sweep will act, so it is not "stuck"

    def waiting_overdue(now):
        stuck = {(r["workflow_class"], r["reason"]): r["count"] for r in gauge(now)["stuck"]}
        return stuck[("sig_pay", "waiting_overdue")], stuck[("sig_timeout_pause", "waiting_overdue")]

    assert waiting_overdue(timezone.now()) == (0, 0)
    assert waiting_overdue(timezone.now() + timedelta(hours=23)) == (0, 0)
    assert waiting_overdue(timezone.now() + timedelta(hours=25)) == (1, 0)


@pytest.mark.django_db
def test_the_gauge_no_longer_counts_a_wait_that_ended(order):
    wf = park(SigPay, order)
    WorkflowStep.objects.filter(run_id=wf.record.pk, status="waiting").update(
        waiting_since=timezone.now() - timedelta(days=2)
    )
    stuck = {(r["workflow_class"], r["reason"]): r["count"] for r in gauge(timezone.now())["stuck"]}
    assert stuck[("sig_pay", "waiting_overdue")] == 1

    wf.signal("paid")

    stuck = {(r["workflow_class"], r["reason"]): r["count"] for r in gauge(timezone.now())["stuck"]}
    assert stuck[("sig_pay", "waiting_overdue")] == 0


@pytest.mark.django_db
def test_a_reattempt_after_an_error_runs_again_with_the_signal_it_received(order):
    wf = park(SigFlakyCapture, order)
    signal = wf.signal("paid", {"amount": 42})

    run_all()

    wf.reload()
    assert [(s.attempt, s.status) for s in steps_of(wf)] == [(1, "failed"), (2, "completed")]
    assert step_row(wf, "capture").output == {
        "timed_out": False,
        "signal": {
            "id": signal.pk,
            "name": "paid",
            "payload": {"amount": 42},
            "actor": "api",
            "received_at": signal.received_at.isoformat(),
        },
    }
    assert wf.status == "finished"
    assert labels() == ["capture 1", "capture 2"]


# -- direct executor use: the gate ----------------------------------------------------------------


@pytest.mark.django_db
def test_the_gate_parks_and_execute_step_returns_none(order):
    wf = SigTimeoutRun.start(order)
    (claimed,) = claim_due_steps(1, queues=[Q])

    assert execute_step(claimed) is None

    assert wf.reload().status == "waiting"
    assert step_row(wf, "capture").status == "waiting"
    assert labels() == []


# -- (7) the test helpers -------------------------------------------------------------------------


class SignalHelperTests(WorkflowTestMixin, TestCase):
    def setUp(self):
        self.order = Order.objects.create()

    def test_deliver_signal_runs_the_woken_step(self):
        wf = SigPay.start(self.order)
        self.perform_next_step(wf)  # prepare
        self.perform_next_step(wf)  # capture parks
        self.assertWorkflowStatus(wf, "waiting")

        self.deliver_signal(wf, "paid", {"amount": 42})

        self.assertWorkflowStatus(wf, "ready")
        capture = step_row(wf, "capture")
        assert capture.status == "completed"
        assert capture.output["signal"]["payload"] == {"amount": 42}
        assert capture.output["signal"]["actor"] == "test_helpers"
        assert WorkflowSignal.objects.get().status == "consumed"
        self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")
        self.assertStepsCompleted(wf, ["prepare", "capture", "ship"])

    def test_deliver_signal_to_a_ready_run_runs_the_step_that_takes_it(self):
        wf = SigAnyOf.start(self.order)

        self.deliver_signal(wf, "cash", {"eur": 5})

        assert step_row(wf, "pay").output["signal"]["name"] == "cash"
        self.assertWorkflowStatus(wf, "ready")
        self.speedrun_workflow(wf)
        self.assertStepsCompleted(wf, ["pay", "done"])

    def test_deliver_signal_with_a_duplicate_key_runs_nothing(self):
        wf = SigPay.start(self.order)
        self.perform_next_step(wf)
        self.perform_next_step(wf)
        self.deliver_signal(wf, "paid", {"amount": 1}, idempotency_key="evt_1")
        before = snapshot(wf)

        self.deliver_signal(wf, "paid", {"amount": 1}, idempotency_key="evt_1")

        assert snapshot(wf) == before
        assert labels() == ["prepare", "capture"]
        assert step_row(wf, "ship").status == "scheduled"
        assert WorkflowSignal.objects.count() == 1

    def test_deliver_signal_that_no_step_waits_for_leaves_the_run_waiting(self):
        wf = SigPay.start(self.order)
        self.perform_next_step(wf)
        self.perform_next_step(wf)

        with self.assertRaises(StepWaiting):
            self.deliver_signal(wf, "refunded")

        self.assertWorkflowStatus(wf, "waiting")
        assert WorkflowSignal.objects.get().status == "pending"

    def test_speedrun_raises_step_waiting_naming_the_step_and_the_signal(self):
        wf = SigTimeoutPause.start(self.order)

        with self.assertRaises(StepWaiting) as raised:
            self.speedrun_workflow(wf)

        assert str(raised.exception).endswith(
            "is waiting on step capture for signal paid: deliver_signal moves it on, expire_wait times it out"
        )
        assert str(wf.workflow_id) in str(raised.exception)
        self.assertWorkflowStatus(wf, "waiting")

    def test_speedrun_message_without_a_timeout_does_not_offer_expire_wait(self):
        wf = SigPay.start(self.order)

        with self.assertRaises(StepWaiting) as raised:
            self.speedrun_workflow(wf)

        assert str(raised.exception).endswith("is waiting on step capture for signal paid: deliver_signal moves it on")
        self.assertStepsCompleted(wf, ["prepare"])
        with self.assertRaises(StepWaiting):
            self.perform_next_step(wf)

    def test_expire_wait_applies_on_timeout_pause(self):
        wf = SigTimeoutPause.start(self.order)
        self.perform_next_step(wf)

        self.expire_wait(wf)

        self.assertWorkflowStatus(wf, "paused")
        capture = step_row(wf, "capture")
        assert (capture.status, capture.error_class) == ("failed", "pgbus_workflows.exceptions.WaitTimedOut")
        assert "wait_timed_out" in kinds(wf)

    def test_expire_wait_applies_on_timeout_run(self):
        wf = SigTimeoutRun.start(self.order)
        self.perform_next_step(wf)

        self.expire_wait(wf)
        self.assertWorkflowStatus(wf, "ready")
        self.speedrun_workflow(wf)

        self.assertWorkflowStatus(wf, "finished")
        assert step_row(wf, "capture").output == {"timed_out": True, "signal": None}
        self.assertStepsCompleted(wf, ["capture", "after"])

    def test_expire_wait_applies_on_timeout_skip_and_cancel(self):
        skipped = SigTimeoutSkip.start(self.order)
        self.perform_next_step(skipped)
        self.expire_wait(skipped)
        self.speedrun_workflow(skipped)
        self.assertWorkflowStatus(skipped, "finished")
        self.assertStepsCompleted(skipped, ["after"])

        cancelled = SigTimeoutCancel.start(self.order)
        self.perform_next_step(cancelled)
        self.expire_wait(cancelled)
        self.assertWorkflowStatus(cancelled, "cancelled")

    def test_expire_wait_needs_a_wait_timeout(self):
        wf = SigPay.start(self.order)
        self.perform_next_step(wf)
        self.perform_next_step(wf)

        with self.assertRaisesRegex(TestHelperError, "no waiting step with a wait_timeout"):
            self.expire_wait(wf)
        self.assertWorkflowStatus(wf, "waiting")
