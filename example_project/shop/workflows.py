"""An order: reserve the stock, wait for the payment, ship it, confirm.

Shows ``wait_for=`` with ``wait_timeout=`` and ``on_timeout=`` (an unpaid order expires),
``self.received_signal`` and ``self.timed_out``, a class ``OnException`` reattempt policy
for a flaky carrier (with ``backoff()`` and ``max_reattempts``), ``step_idempotency_key`` for a
side effect, and the default policy (pause) for an error no retry can fix. ``order_function`` is
the same order written as a durable function: code with a branch, its checkpoints replayed.
"""

from __future__ import annotations

from typing import Any

from pgbus_workflows import OnException, Workflow, backoff, durable, step

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


def _set_status(order: Order, status: str) -> None:
    Order.objects.filter(pk=order.pk).update(status=status)


def _capture(order: Order, payment: dict[str, Any]) -> dict[str, Any]:
    """Record the payment; a wrong amount raises, which pauses the run at this checkpoint."""
    if payment["amount_cents"] != order.total_cents:
        raise ValueError(f"{order} costs {order.total_cents} cents, the payment was {payment['amount_cents']}")
    Payment.objects.get_or_create(
        reference=payment["reference"], defaults={"order": order, "amount_cents": payment["amount_cents"]}
    )
    _set_status(order, Order.Status.PAID)
    return {"reference": payment["reference"]}


def _ship(order: Order, idempotency_key: str) -> str:
    order.refresh_from_db()  # inside the checkpoint: an operator may have fixed the postcode since
    tracking = book_shipment(order, idempotency_key=idempotency_key)
    Order.objects.filter(pk=order.pk).update(status=Order.Status.SHIPPED, tracking_number=tracking)
    return tracking


@durable(name="shop_order_function", exception_policies=OrderFulfilment.exception_policies)
def order_function(ctx: Any) -> dict[str, Any]:
    """:class:`OrderFulfilment` written as code (the tutorial's part 9, with the example's carrier).

    Each ``ctx.step`` is a checkpoint: run once, its return recorded and replayed whenever the
    function runs again (after the wait, a reattempt, a resume). The class's carrier policy
    reattempts ``ship``, whose idempotency key is the same on every attempt. An unpaid order
    branches to ``release`` and the run finishes with that result (the class cancels instead).
    """
    order = ctx.subject
    ctx.step("reserve_stock", lambda: _set_status(order, Order.Status.RESERVED))
    payment = ctx.wait_for("payment_received", timeout=duration("payment_timeout"))
    if payment is None:
        ctx.step("release", lambda: _set_status(order, Order.Status.EXPIRED))
        return {"released": "no payment before the timeout"}
    ctx.step("capture_payment", lambda: _capture(order, payment))
    tracking = ctx.step("ship", lambda: _ship(order, ctx.step_idempotency_key))
    return {"email": order.customer_email, "message": f"Your order is on its way: {tracking}"}


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
