"""A sign-up, and the drip emails sent to it (the outbox a mail worker would read)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Signup(models.Model):
    """Someone who signed up for a trial."""

    class Plan(models.TextChoices):
        TRIAL = "trial", "trial"
        PAID = "paid", "paid"

    email = models.EmailField(unique=True)
    name = models.CharField(max_length=100)
    plan = models.CharField(max_length=8, choices=Plan.choices, default=Plan.TRIAL)
    marketing_opt_in = models.BooleanField("wants tips", default=True)
    unsubscribed = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


class DripEmail(models.Model):
    """One email of the drip, written in the step that sends it: exactly one per kind."""

    class Kind(models.TextChoices):
        WELCOME = "welcome", "welcome"
        TIPS = "tips", "tips"
        UPGRADE_OFFER = "upgrade_offer", "upgrade offer"

    signup = models.ForeignKey(Signup, on_delete=models.CASCADE, related_name="emails")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    subject = models.CharField(max_length=200)
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("id",)
        constraints = [models.UniqueConstraint(fields=["signup", "kind"], name="signup_one_email_per_kind")]

    def __str__(self) -> str:
        return f"{self.kind} to {self.signup.email}"
