"""The signup drip: a welcome email now, tips later, then an upgrade offer.

Shows ``wait=`` (a callable, read when the step is scheduled), ``skip_if=`` (a lambda and a
method name), ``cancel_if()`` (an unsubscribe ends the drip before its next email) and
``atomic=True`` (the email row commits with the step's outcome, exactly once).
"""

from __future__ import annotations

from pgbus_workflows import Workflow, step

from ..durations import duration
from .models import DripEmail, Signup


def send(signup: Signup, kind: str, subject: str) -> dict[str, str]:
    """Queue one drip email (a real project would hand it to its mail service here)."""
    DripEmail.objects.create(signup=signup, kind=kind, subject=subject)
    return {"sent": kind, "to": signup.email}


class SignupDrip(Workflow):
    """Onboarding emails for a new trial sign-up."""

    name = "signup_drip"

    def cancel_if(self) -> bool:
        """Checked before every step: someone who unsubscribed gets nothing more."""
        return bool(self.subject.unsubscribed)

    def already_paid(self) -> bool:
        """``skip_if`` by method name: a paying customer needs no upgrade offer."""
        return bool(self.subject.plan == Signup.Plan.PAID)

    @step(atomic=True)
    def welcome(self) -> dict[str, str]:
        return send(self.subject, DripEmail.Kind.WELCOME, f"Welcome aboard, {self.subject.name}!")

    @step(
        wait=lambda attempt: duration("signup_tips_after"),
        skip_if=lambda wf: not wf.subject.marketing_opt_in,
        atomic=True,
    )
    def tips(self) -> dict[str, str]:
        return send(self.subject, DripEmail.Kind.TIPS, "Three things to try this week")

    @step(wait=lambda attempt: duration("signup_offer_after"), skip_if="already_paid", atomic=True)
    def upgrade_offer(self) -> dict[str, str]:
        return send(self.subject, DripEmail.Kind.UPGRADE_OFFER, "Your trial ends soon: 20% off the first year")
