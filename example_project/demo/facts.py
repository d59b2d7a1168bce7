"""What the workflows did to the business rows: the demo's proof that the steps really ran."""

from __future__ import annotations

from django.db.models import Count, Sum

from ..gallery.models import Image
from ..shop.models import CarrierBooking, Order
from ..signup.models import DripEmail


def facts() -> list[str]:
    """A few lines counting emails sent, orders shipped, carrier calls and thumbnails."""
    emails = dict(DripEmail.objects.values_list("kind").annotate(n=Count("pk")).order_by())
    sent = ", ".join(f"{emails[kind]} {label}" for kind, label in DripEmail.Kind.choices if emails.get(kind))
    shipped = Order.objects.filter(status=Order.Status.SHIPPED).count()
    expired = Order.objects.filter(status=Order.Status.EXPIRED).count()
    calls = CarrierBooking.objects.aggregate(n=Sum("calls"))["n"] or 0
    bookings = CarrierBooking.objects.exclude(tracking_number="").count()
    images = Image.objects.count()
    thumbs = Image.objects.filter(processed_at__isnull=False).count()
    return [
        f"emails sent: {sum(emails.values())} ({sent or 'none'})",
        f"orders: {shipped} shipped, {expired} expired unpaid",
        f"carrier: {calls} calls for {bookings} booking{'' if bookings == 1 else 's'} "
        "(timeouts retried with the same idempotency key)",
        f"images: {thumbs} of {images} got a thumbnail size and a checksum",
    ]
