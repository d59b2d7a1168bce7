"""The schedule rows: one per declared or added ``Schedule``, and each schedule's audit trail.

Models are data and queries only; ``services/schedules.py`` and ``services/firing.py`` change them.
``models.py`` imports this module, so Django sees these models as the app's.
"""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.utils.timezone import now
from django.utils.translation import gettext_lazy as _

from ..dsl.schedules import CATCHUP_POLICIES, OVERLAP_POLICIES, default_name, describe
from ..states import ScheduleEventKind
from .reading import ReadingQuerySet


class WorkflowSchedule(models.Model):
    """When a workflow class starts runs on its own: a cron expression or an interval, and its policies."""

    name = models.CharField(_("name"), max_length=255)
    workflow_class = models.CharField(_("workflow class"), max_length=255)
    cron = models.CharField(_("cron"), max_length=255, blank=True, default="")
    every = models.DurationField(_("every"), null=True, blank=True)
    timezone = models.CharField(_("time zone"), max_length=64, default="UTC")
    arguments = models.JSONField(_("arguments"), default=dict, blank=True, encoder=DjangoJSONEncoder)
    overlap = models.CharField(_("overlap"), max_length=16, default="skip", choices=[(p, p) for p in OVERLAP_POLICIES])
    catchup = models.CharField(
        _("catch-up"), max_length=16, default="latest", choices=[(p, p) for p in CATCHUP_POLICIES]
    )
    jitter = models.DurationField(_("jitter"), null=True, blank=True)
    #: From the declaration (``enabled=``): a disabled schedule fires only when fired by hand.
    enabled = models.BooleanField(_("enabled"), default=True)
    #: Declared in a class's ``schedules`` (synced from code), or added at run time.
    declared = models.BooleanField(_("declared in code"), default=False)
    #: An operator's pause: no tick fires until resumed (the ticks in between are not caught up).
    paused = models.BooleanField(_("paused"), default=False)
    #: The next tick, as the expression gives it (the run's ``scheduled_for``).
    next_fire_at = models.DateTimeField(_("next fire at"), null=True, blank=True)
    #: When the leader fires the next tick: ``next_fire_at`` plus its jitter.
    due_at = models.DateTimeField(_("due at"), null=True, blank=True)
    last_fired_at = models.DateTimeField(_("last fired at"), null=True, blank=True)
    last_run = models.ForeignKey(
        "pgbus_workflows.WorkflowRun",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("last run"),
    )
    #: Why the schedule's last tick (or its sync from code) failed; cleared when a tick starts its run.
    last_error = models.TextField(_("last error"), blank=True, default="", db_default="")
    last_error_at = models.DateTimeField(_("last error at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=now)
    updated_at = models.DateTimeField(_("updated at"), default=now)

    objects = ReadingQuerySet["WorkflowSchedule"].as_manager()

    class Meta:
        verbose_name = _("workflow schedule")
        verbose_name_plural = _("workflow schedules")
        ordering = ("workflow_class", "name")
        constraints = [
            models.UniqueConstraint(fields=["workflow_class", "name"], name="pgbus_wf_schedule_unique_name"),
            models.CheckConstraint(
                condition=(Q(cron="") & Q(every__isnull=False)) | (~Q(cron="") & Q(every__isnull=True)),
                name="pgbus_wf_schedule_cron_or_every",
            ),
            models.CheckConstraint(condition=Q(overlap__in=OVERLAP_POLICIES), name="pgbus_wf_schedule_overlap"),
            models.CheckConstraint(condition=Q(catchup__in=CATCHUP_POLICIES), name="pgbus_wf_schedule_catchup"),
        ]
        indexes = [
            # Serves the leader's "what is due" and "when is the next" only: paused rows never enter it.
            models.Index(fields=["due_at"], condition=Q(enabled=True, paused=False), name="pgbus_wf_schedule_due"),
        ]
        permissions = [
            ("pause_workflowschedule", _("Can pause and resume workflow schedules")),
            ("fire_workflowschedule", _("Can fire workflow schedules now")),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_class} {self.name}"

    @property
    def expression(self) -> str:
        """The cron expression, or ``every <seconds>s``."""
        return default_name(self.cron or None, self.every).removeprefix("cron ")

    @property
    def in_words(self) -> str:
        """The schedule in words, with its time zone for a cron expression."""
        words = describe(self.cron, self.every)
        return f"{words} ({self.timezone})" if self.cron and self.timezone != "UTC" else words


class ScheduleEvent(models.Model):
    """One line of a schedule's audit trail: an operator verb, a skipped or missed tick."""

    schedule = models.ForeignKey(
        WorkflowSchedule, on_delete=models.CASCADE, related_name="events", verbose_name=_("schedule"), db_index=False
    )
    kind = models.CharField(_("kind"), max_length=32, choices=ScheduleEventKind.choices)
    actor = models.CharField(_("actor"), max_length=255, blank=True, default="")
    reason = models.TextField(_("reason"), blank=True, default="")
    details = models.JSONField(_("details"), default=dict, blank=True, encoder=DjangoJSONEncoder)
    run = models.ForeignKey(
        "pgbus_workflows.WorkflowRun",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("run"),
    )
    created_at = models.DateTimeField(_("created at"), default=now)

    objects = ReadingQuerySet["ScheduleEvent"].as_manager()

    class Meta:
        verbose_name = _("schedule event")
        verbose_name_plural = _("schedule events")
        ordering = ("id",)
        indexes = [
            models.Index(fields=["schedule", "id"], name="pgbus_wf_schedule_event"),
            # Serves the sweep's retention of the audit trail (oldest first).
            models.Index(fields=["created_at"], name="pgbus_wf_schedule_event_age"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor or 'system'}"
