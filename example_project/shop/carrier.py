"""A sandbox shipping carrier: flaky on purpose, idempotent by key, like the real ones.

Its API times out on the first ``FLAKY_CALLS`` calls of every booking, then answers with
a tracking number; calling again with the same idempotency key gives the same number.
An order without a postcode is refused for good (no retry helps: an operator must fix it).
"""

from __future__ import annotations

import hashlib

from django.db.models import F

from .models import CarrierBooking, Order

#: How many calls of each booking time out before the carrier answers.
FLAKY_CALLS = 2


class CarrierUnavailable(ConnectionError):
    """The carrier's API timed out: worth trying again a bit later."""


class AddressRejected(ValueError):
    """The carrier refuses the address: trying again will not help."""


def book_shipment(order: Order, idempotency_key: str) -> str:
    """Book a pickup for ``order``; returns the tracking number."""
    if not order.postcode.strip():
        raise AddressRejected(f"{order} has no postcode: fix the address in the admin, then resume the run")
    booking, _ = CarrierBooking.objects.get_or_create(idempotency_key=idempotency_key, defaults={"order": order})
    CarrierBooking.objects.filter(pk=booking.pk).update(calls=F("calls") + 1)
    booking.refresh_from_db()
    if booking.calls <= FLAKY_CALLS:
        raise CarrierUnavailable(f"carrier API timed out booking {order} (call {booking.calls})")
    if not booking.tracking_number:
        digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:10].upper()
        booking.tracking_number = f"SBX{digest}"
        booking.save(update_fields=["tracking_number"])
    return booking.tracking_number
