"""The limiters: one row per concurrency key (its slots) and per rate-limit key (its token bucket).

Models are data and queries only; the claim takes slots and spends tokens (``sql.limiting``),
the outcome and the sweep give slots back (``services.limiting``).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .reading import ReadingQuerySet


class WorkflowLimiter(models.Model):
    """One ``Concurrency`` key's slots or one ``RateLimit`` key's token bucket, shared by every dispatcher.

    ``name`` is ``concurrency:<key>`` or ``rate:<key>``; a step scheduled under the limit
    stores it (``WorkflowStep.limiters``), and the claim locks this row to take a slot or a
    token. The limit is the declaration's: written again when a step is scheduled under a
    changed one.
    """

    name = models.CharField(_("name"), max_length=300, primary_key=True)
    kind = models.CharField(_("kind"), max_length=16)
    limit = models.PositiveIntegerField(_("limit"))
    #: Concurrency: the steps of the key in progress now.
    in_use = models.IntegerField(_("in use"), default=0)
    #: Rate limit: the bucket's period, its tokens when last counted, and when that was.
    per = models.DurationField(_("per"), null=True, blank=True)
    tokens = models.FloatField(_("tokens"), null=True, blank=True)
    refilled_at = models.DateTimeField(_("refilled at"), null=True, blank=True)
    #: Rate limit, emptied bucket: when its next token comes (the dispatchers' loop wakes then).
    available_at = models.DateTimeField(_("next token at"), null=True, blank=True)
    #: Concurrency: when the sweep last set ``in_use`` to the attempts really holding a slot
    #: (rows deleted outside the library had leaked some; ``services.slots.reconcile``).
    repaired_at = models.DateTimeField(_("slots repaired at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)

    objects = ReadingQuerySet["WorkflowLimiter"].as_manager()

    class Meta:
        verbose_name = _("workflow limiter")
        verbose_name_plural = _("workflow limiters")
        ordering = ("name",)
        indexes = [
            models.Index(
                fields=["available_at"], condition=Q(available_at__isnull=False), name="pgbus_wf_limiter_refill"
            ),
        ]

    def __str__(self) -> str:
        return self.name
