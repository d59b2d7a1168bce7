"""The order workflow: payment signal, its timeout, the flaky carrier, an operator's fix; the scheduled report."""

from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from django.contrib.auth.models import User
from django.test import TestCase
from django.urls import reverse

from pgbus_workflows import StepWaiting
from pgbus_workflows.testing import WorkflowTestMixin

from . import carrier
from .models import CarrierBooking, Order, Payment
from .workflows import OrderFulfilment, SalesReport, order_function

PAYMENT = {"amount_cents": 4900, "reference": "pi_123"}


def place(**fields: object) -> Order:
    defaults: dict[str, object] = {
        "number": "A-1",
        "customer_email": "bob@example.com",
        "total_cents": 4900,
        "postcode": "10115",
    }
    return Order.objects.create(**{**defaults, **fields})


class OrderFulfilmentTests(WorkflowTestMixin, TestCase):
    def waiting_for_payment(self, order: Order) -> OrderFulfilment:
        wf: OrderFulfilment = OrderFulfilment.start(order)
        self.run_step_inline(wf, "reserve_stock")
        self.run_step_inline(wf, "capture_payment")  # no payment yet: the step parks
        self.assertWorkflowStatus(wf, "waiting")
        return wf

    def test_a_paid_order_ships_after_the_carrier_timeouts(self) -> None:
        order = place()
        wf = self.waiting_for_payment(order)
        self.deliver_signal(wf, "payment_received", PAYMENT, idempotency_key="pi_123")
        with self.assertLogs("pgbus_workflows", "INFO") as logs:  # each reattempt the policy expects
            self.speedrun_workflow(wf)
        reattempts = [r for r in logs.records if "reattempt" in r.getMessage()]
        self.assertEqual([r.levelname for r in reattempts], ["INFO", "INFO"])
        self.assertWorkflowStatus(wf, "finished")
        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.SHIPPED)
        self.assertEqual(Payment.objects.get().reference, "pi_123")
        # The carrier timed out twice; the same idempotency key booked once.
        ship = wf.steps.filter(step_name="ship")
        self.assertEqual(list(ship.values_list("outcome", flat=True)), ["reattempted", "reattempted", "success"])
        booking = CarrierBooking.objects.get()
        self.assertEqual((booking.calls, booking.tracking_number), (3, order.tracking_number))
        self.assertEqual(wf.outputs["confirm"]["email"], "bob@example.com")

    def test_the_run_waits_for_the_payment(self) -> None:
        wf = self.waiting_for_payment(place())
        with self.assertRaises(StepWaiting):
            self.speedrun_workflow(wf)

    def test_a_payment_that_comes_early_waits_for_the_step(self) -> None:
        order = place()
        wf = OrderFulfilment.start(order)
        OrderFulfilment.signal_for(order, "payment_received", payload=PAYMENT, idempotency_key="pi_123")
        with self.assertLogs("pgbus_workflows", "INFO"):  # the carrier's timeouts, reattempted
            self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")

    def test_a_webhook_delivered_twice_counts_once(self) -> None:
        wf = self.waiting_for_payment(place())
        self.deliver_signal(wf, "payment_received", PAYMENT, idempotency_key="pi_123")
        again = wf.signal("payment_received", PAYMENT, idempotency_key="pi_123")
        self.assertTrue(again.duplicate_delivery)
        self.assertEqual(wf.signals.count(), 1)

    def test_an_unpaid_order_expires_when_the_wait_times_out(self) -> None:
        order = place()
        wf = self.waiting_for_payment(order)
        self.expire_wait(wf)  # on_timeout="run": the step is due again, timed out
        self.perform_next_step(wf)  # and runs, with self.timed_out
        self.assertWorkflowStatus(wf, "cancelled")
        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.EXPIRED)

    def test_an_order_without_a_postcode_pauses_until_an_operator_fixes_it(self) -> None:
        order = place(postcode="")
        wf = self.waiting_for_payment(order)
        self.deliver_signal(wf, "payment_received", PAYMENT)
        with self.assertLogs("pgbus_workflows", "WARNING"):
            self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "paused")
        self.assertIn("has no postcode", wf.record.paused_reason)
        Order.objects.filter(pk=order.pk).update(postcode="10115")
        wf.resume(actor="alice", reason="address fixed")
        with self.assertLogs("pgbus_workflows", "INFO"):  # the carrier's timeouts, reattempted
            self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")

    def test_a_carrier_that_stays_down_pauses_the_run_after_five_reattempts(self) -> None:
        wf = self.waiting_for_payment(place())
        with mock.patch.object(carrier, "FLAKY_CALLS", 100), self.assertLogs("pgbus_workflows", "WARNING"):
            self.deliver_signal(wf, "payment_received", PAYMENT)
            self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "paused")
        self.assertEqual(wf.steps.filter(step_name="ship").count(), 6)
        # backoff(): reattempt n waits a random part of 0.5 s * 2 ** (n - 1), capped at 4 s.
        reattempts = wf.events.filter(kind="step_reattempted").order_by("pk")
        waits = [event.details["wait_seconds"] for event in reattempts]
        self.assertEqual(len(waits), 5)
        for wait, ceiling in zip(waits, (0.5, 1, 2, 4, 4), strict=True):
            self.assertTrue(0 <= wait <= ceiling, (waits, ceiling))

    def test_a_wrong_amount_pauses_the_run(self) -> None:
        wf = self.waiting_for_payment(place())
        with self.assertLogs("pgbus_workflows", "WARNING"):
            self.deliver_signal(wf, "payment_received", {**PAYMENT, "amount_cents": 100})
        self.assertWorkflowStatus(wf, "paused")
        self.assertFalse(Payment.objects.exists())


class OrderFunctionTests(WorkflowTestMixin, TestCase):
    """The same order as a durable function: its checkpoints, its branch, the class's carrier policy."""

    def waiting_for_payment(self, order: Order) -> Any:
        wf = order_function.start(order)
        self.perform_next_step(wf)  # reserve_stock, then the function parks at the wait
        self.assertWorkflowStatus(wf, "waiting")
        return wf

    def test_a_paid_order_ships_after_the_carrier_timeouts_and_each_body_ran_once(self) -> None:
        order = place()
        wf = self.waiting_for_payment(order)
        self.deliver_signal(wf, "payment_received", PAYMENT)
        with self.assertLogs("pgbus_workflows", "INFO"):  # the carrier's timeouts, reattempted
            self.speedrun_workflow(wf)
        order.refresh_from_db()
        message = f"Your order is on its way: {order.tracking_number}"
        self.assertEqual(wf.result(), {"email": "bob@example.com", "message": message})
        self.assertEqual(order.status, Order.Status.SHIPPED)
        ship = wf.steps.filter(step_name="ship")
        self.assertEqual(list(ship.values_list("outcome", flat=True)), ["reattempted", "reattempted", "success"])
        booking = CarrierBooking.objects.get()  # one key for the checkpoint's three attempts
        self.assertEqual((booking.idempotency_key, booking.calls), (f"{wf.workflow_id}:ship", 3))
        self.assertEqual(Payment.objects.get().reference, "pi_123")  # capture_payment ran once, replayed after

    def test_an_unpaid_order_is_released_when_the_timeout_passes(self) -> None:
        order = place()
        wf = self.waiting_for_payment(order)
        self.advance(timedelta(days=1))  # the virtual clock: the wait's timeout is due, no sleeping
        self.speedrun_workflow(wf)
        self.assertEqual(wf.result(), {"released": "no payment before the timeout"})
        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.EXPIRED)
        self.assertFalse(wf.steps.filter(step_name="ship").exists())

    def test_an_order_without_a_postcode_pauses_at_ship_and_a_resume_runs_only_ship_again(self) -> None:
        order = place(postcode="")
        wf = self.waiting_for_payment(order)
        with self.assertLogs("pgbus_workflows", "WARNING"):
            self.deliver_signal(wf, "payment_received", PAYMENT)
            self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "paused")
        self.assertIn("has no postcode", wf.record.paused_reason)
        Order.objects.filter(pk=order.pk).update(postcode="10115")
        wf.resume(actor="alice", reason="address fixed")
        with self.assertLogs("pgbus_workflows", "INFO"):
            self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")
        self.assertEqual(wf.steps.filter(step_name="capture_payment").count(), 1)  # replayed, not run again
        self.assertEqual(Payment.objects.count(), 1)


class OrderAdminTests(TestCase):
    def test_the_order_pages_render(self) -> None:
        order = place()
        Payment.objects.create(order=order, amount_cents=4900, reference="pi_123")
        self.client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
        self.assertContains(self.client.get(reverse("admin:shop_order_changelist")), "A-1")
        self.assertContains(self.client.get(reverse("admin:shop_order_change", args=[order.pk])), "pi_123")
        for name in ("payment", "carrierbooking"):
            self.assertEqual(self.client.get(reverse(f"admin:shop_{name}_changelist")).status_code, 200)


class SalesReportTests(WorkflowTestMixin, TestCase):
    def test_each_tick_reports_the_payments_up_to_its_own_time(self) -> None:
        start = datetime(2026, 3, 1, 5, 0, tzinfo=UTC)
        an_hour_before = start - timedelta(hours=1)
        SalesReport.add_schedule(
            cron="0 6 * * *", timezone="Europe/Paris", start_at=an_hour_before, catchup="all", overlap="allow"
        )
        order = place()
        Payment.objects.create(order=order, amount_cents=4900, reference="pi_1", received_at=start)
        Payment.objects.create(order=order, amount_cents=900, reference="pi_2", received_at=start + timedelta(days=1))
        self.assertEqual(self.tick_schedules(now=start - timedelta(seconds=1)), [])  # 06:00 Paris is 05:00 UTC: not yet

        first, second = self.tick_schedules(now=start + timedelta(days=1, hours=1))  # a day late: both fire

        self.assertEqual([first.scheduled_for, second.scheduled_for], [start, start + timedelta(days=1)])
        for wf, payments in ((first, 1), (second, 2)):
            self.speedrun_workflow(wf)
            self.assertEqual(wf.outputs["total"], {"for": wf.scheduled_for.isoformat(), "payments": payments})
