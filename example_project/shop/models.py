"""Orders, their payments, and the sandbox carrier's bookings."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Order(models.Model):
    """A customer's order, from checkout to shipping."""

    class Status(models.TextChoices):
        NEW = "new", "new"
        RESERVED = "reserved", "stock reserved"
        PAID = "paid", "paid"
        SHIPPED = "shipped", "shipped"
        EXPIRED = "expired", "expired (never paid)"

    number = models.CharField(max_length=20, unique=True)
    customer_email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    postcode = models.CharField(max_length=12, blank=True, help_text="the carrier refuses an order without one")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.NEW)
    tracking_number = models.CharField(max_length=40, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"order {self.number}"


class Payment(models.Model):
    """A payment the payment provider told us about (its webhook sends the signal)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="payments")
    amount_cents = models.PositiveIntegerField()
    reference = models.CharField(max_length=64, unique=True)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.reference} ({self.amount_cents / 100:.2f})"


class CarrierBooking(models.Model):
    """The sandbox carrier's side of a booking, by idempotency key: how often it was called."""

    idempotency_key = models.CharField(max_length=100, unique=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="carrier_bookings")
    calls = models.PositiveIntegerField(default=0)
    tracking_number = models.CharField(max_length=40, blank=True)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return self.tracking_number or f"booking for {self.order} ({self.calls} calls)"
