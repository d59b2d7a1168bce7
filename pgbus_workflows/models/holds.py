"""The holds: an operator's stop on the claims of one workflow class or one queue, and its release.

Models are data and queries only; ``services.holding`` places and lifts holds, and the claim
(``sql.claiming.claim_steps``) reads the active ones.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class HoldKind(models.TextChoices):
    """What a hold stops: the steps of a workflow class, or the steps on a queue."""

    CLASS = "class", _("workflow class")
    QUEUE = "queue", _("queue")


class WorkflowHoldQuerySet(models.QuerySet["WorkflowHold"]):
    """Holds by state."""

    def active(self) -> WorkflowHoldQuerySet:
        """The holds not yet released (at most one per kind and name)."""
        return self.filter(released_at__isnull=True)


class WorkflowHold(models.Model):
    """One hold of a class or a queue: who placed it, when and why, and who released it.

    A row is kept after its release (``released_at`` set): the table is the holds' audit
    trail, one row per hold, where an event per run would be thousands of rows.
    """

    kind = models.CharField(_("kind"), max_length=8, choices=HoldKind.choices)
    #: The workflow class's ``name``, or the queue's.
    name = models.CharField(_("name"), max_length=200)
    held_at = models.DateTimeField(_("held at"), default=timezone.now)
    held_by = models.CharField(_("held by"), max_length=200)
    reason = models.TextField(_("reason"))
    released_at = models.DateTimeField(_("released at"), null=True, blank=True)
    released_by = models.CharField(_("released by"), max_length=200, blank=True, default="")
    release_reason = models.TextField(_("release reason"), blank=True, default="")

    objects = WorkflowHoldQuerySet.as_manager()

    class Meta:
        verbose_name = _("workflow hold")
        verbose_name_plural = _("workflow holds")
        ordering = ("-held_at",)
        constraints = [
            # One active hold per class or queue; the claim reads the active ones through it.
            models.UniqueConstraint(
                fields=["kind", "name"], condition=Q(released_at__isnull=True), name="pgbus_wf_hold_active"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"
