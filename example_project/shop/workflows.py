"""An order: reserve the stock, wait for the payment, ship it, confirm.

Shows ``wait_for=`` with ``wait_timeout=`` and ``on_timeout=`` (an unpaid order expires),
``self.received_signal`` and ``self.timed_out``, a class ``OnException`` reattempt policy
for a flaky carrier (with ``backoff()`` and ``max_reattempts``), ``step_idempotency_key`` for a
side effect, and the default policy (pause) for an error no retry can fix.
"""

from __future__ import annotations

from typing import Any

from pgbus_workflows import OnException, Workflow, backoff, step

from ..durations import duration
from .carrier import CarrierUnavailable, book_shipment
from .models import Order, Payment


class OrderFulfilment(Workflow):
    """From checkout to the shipping confirmation."""

    name = "shop_order"
    exception_policies = [
        # The carrier's timeouts: call again after an exponential backoff with full jitter (attempt n
        # waits a random part of 0.5 s * 2 ** (n - 1), at most 4 s; real life: minutes), so that
        # orders failed by one outage do not all call back at once; after 5 in a row, pause.
        OnException(
            CarrierUnavailable,
            action="reattempt",
            wait=backoff(base=duration("carrier_retry"), max=duration("carrier_retry") * 8),
            max_reattempts=5,
        ),
    ]

    @step
    def reserve_stock(self) -> None:
        Order.objects.filter(pk=self.subject.pk).update(status=Order.Status.RESERVED)

    # on_timeout="run": the step itself runs when the payment is late, to release the order
    # (on_timeout="cancel" would only stop the run).
    @step(wait_for="payment_received", wait_timeout=duration("payment_timeout"), on_timeout="run")
    def capture_payment(self) -> dict[str, Any]:
        order = self.subject
        if self.timed_out:
            Order.objects.filter(pk=order.pk).update(status=Order.Status.EXPIRED)
            self.cancel("no payment before the timeout: stock released")
        signal = self.received_signal
        payload: dict[str, Any] = signal.payload if signal is not None and isinstance(signal.payload, dict) else {}
        if payload["amount_cents"] != order.total_cents:
            raise ValueError(f"{order} costs {order.total_cents} cents, the payment was {payload['amount_cents']}")
        Payment.objects.get_or_create(
            reference=payload["reference"], defaults={"order": order, "amount_cents": payload["amount_cents"]}
        )
        Order.objects.filter(pk=order.pk).update(status=Order.Status.PAID)
        return {"reference": payload["reference"]}

    @step
    def ship(self) -> dict[str, str]:
        # Same key on every reattempt: the carrier books once, however often we call.
        tracking = book_shipment(self.subject, idempotency_key=self.step_idempotency_key)
        Order.objects.filter(pk=self.subject.pk).update(status=Order.Status.SHIPPED, tracking_number=tracking)
        return {"tracking_number": tracking}

    @step
    def confirm(self) -> dict[str, str]:
        tracking = self.outputs["ship"]["tracking_number"]
        return {"email": self.subject.customer_email, "message": f"Your order is on its way: {tracking}"}


class SalesReport(Workflow):
    """The day's sales, on a clock: in real life ``Schedule(cron="0 6 * * *", timezone="Europe/Paris")``.

    The demo adds its schedule at run time (``SalesReport.add_schedule(every=...)``), every two
    seconds; ``self.scheduled_for`` is the tick the run is for, whenever it really started.
    """

    name = "shop_sales_report"

    @step
    def total(self) -> dict[str, Any]:
        paid = Payment.objects.filter(received_at__lte=self.scheduled_for)
        return {"for": self.scheduled_for.isoformat(), "payments": paid.count()}
