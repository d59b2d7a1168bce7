"""The insights rollups: attempts finished, per workflow class, step and hour; runs ended, by their start's hour.

The sweep's ``rollups`` phase writes them (``services.rollups``) once every transaction that
could still add to an hour has ended; insights read whole hours here and the rest from the
attempts and runs, so their cost does not grow with the history kept.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .reading import ReadingQuerySet


class WorkflowStepHour(models.Model):
    """The attempts of one step of one workflow class that finished in one hour (UTC), by how they ended.

    ``durations`` is a histogram of the attempts' durations (claim to end): ``{bucket: count}``
    with log-spaced buckets (``services.rollups.bucket``), from which insights take p50 and p95.
    """

    workflow_class = models.CharField(_("workflow class"), max_length=255)
    step_name = models.CharField(_("step"), max_length=255)
    #: The hour's start; the row counts attempts with ``hour <= finished_at < hour + 1 h``.
    hour = models.DateTimeField(_("hour"))
    attempts = models.IntegerField(_("attempts"), default=0)
    completed = models.IntegerField(_("completed"), default=0)
    failed = models.IntegerField(_("failed"), default=0)
    skipped = models.IntegerField(_("skipped"), default=0)
    cancelled = models.IntegerField(_("cancelled"), default=0)
    reattempts = models.IntegerField(_("reattempts"), default=0)
    durations = models.JSONField(_("durations"), default=dict)

    objects = ReadingQuerySet["WorkflowStepHour"].as_manager()

    class Meta:
        verbose_name = _("step hour")
        verbose_name_plural = _("step hours")
        constraints = [
            # leads with what insights filter on: a class, then a range of hours
            models.UniqueConstraint(fields=["workflow_class", "hour", "step_name"], name="pgbus_wf_step_hour"),
        ]
        indexes = [models.Index(fields=["hour"], name="pgbus_wf_step_hour_age")]  # retention's deletes

    def __str__(self) -> str:
        return f"{self.workflow_class}.{self.step_name} {self.hour:%Y-%m-%d %H}:00"


class WorkflowRunHour(models.Model):
    """The finished and cancelled runs of one workflow class that started in one hour (UTC), by step.

    For insights' funnel: ``reached`` counts those runs with an attempt of the step, ``finished``
    and ``cancelled`` those whose ``current_step`` is the step. A run is added once it has ended
    (and so will not change), by the time it ended (``status_changed_at``).
    """

    workflow_class = models.CharField(_("workflow class"), max_length=255)
    step_name = models.CharField(_("step"), max_length=255, blank=True)
    #: The start of the hour the runs started in.
    hour = models.DateTimeField(_("hour"))
    reached = models.IntegerField(_("reached"), default=0)
    finished = models.IntegerField(_("finished"), default=0)
    cancelled = models.IntegerField(_("cancelled"), default=0)

    objects = ReadingQuerySet["WorkflowRunHour"].as_manager()

    class Meta:
        verbose_name = _("run hour")
        verbose_name_plural = _("run hours")
        constraints = [
            # leads with what the funnel filters on: a class, then a range of hours
            models.UniqueConstraint(fields=["workflow_class", "hour", "step_name"], name="pgbus_wf_run_hour"),
        ]
        indexes = [models.Index(fields=["hour"], name="pgbus_wf_run_hour_age")]  # retention's deletes

    def __str__(self) -> str:
        return f"{self.workflow_class}.{self.step_name} started {self.hour:%Y-%m-%d %H}:00"


class WorkflowRollupMark(models.Model):
    """How far a rollup goes, and the checkpoint that lets it go further (a row each: ``step_hours``, ``run_hours``).

    ``rolled_until``: every attempt finished before it is counted in :class:`WorkflowStepHour`
    (``step_hours``), every run ended before it in :class:`WorkflowRunHour` (``run_hours``).
    ``checkpoint_at`` and ``checkpoint_xids``: a time and the transactions of the database that
    held a transaction id when it was taken; once all of those have ended, no attempt that
    finished before ``checkpoint_at`` can still commit, and the rollup may go up to it.
    """

    name = models.CharField(_("name"), max_length=32, primary_key=True)
    rolled_until = models.DateTimeField(_("rolled up until"), null=True, blank=True)
    checkpoint_at = models.DateTimeField(_("checkpoint at"), null=True, blank=True)
    checkpoint_xids = models.JSONField(_("checkpoint transactions"), default=list)

    # read where the hours are read (a replica's mark goes with its rows)
    objects = ReadingQuerySet["WorkflowRollupMark"].as_manager()

    class Meta:
        verbose_name = _("rollup mark")
        verbose_name_plural = _("rollup marks")

    def __str__(self) -> str:
        return f"{self.name} until {self.rolled_until}"
