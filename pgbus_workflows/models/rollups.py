"""The insights rollups: attempts finished, per workflow class, step and hour; runs ended, by their start's hour.

Each is kept twice: by hour for as long as the history, and by five-minute span for the last
days (``services.periods.SPANS_KEPT``). The sweep's ``rollups`` phase writes them
(``services.rollups``) once every transaction that could still add to them has ended; insights
read whole hours, the spans at a window's start and the rest from the attempts and runs, so
their cost grows neither with the history kept nor with the hour's volume.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .reading import ReadingQuerySet


class StepCounts(models.Model):
    """The attempts of one step of one workflow class that finished in one period, by how they ended.

    ``durations`` is a histogram of the attempts' durations (claim to end): ``{bucket: count}``
    with log-spaced buckets (``services.attempt_cells.bucket``), from which insights take p50 and p95.
    """

    workflow_class = models.CharField(_("workflow class"), max_length=255)
    step_name = models.CharField(_("step"), max_length=255)
    attempts = models.IntegerField(_("attempts"), default=0)
    completed = models.IntegerField(_("completed"), default=0)
    failed = models.IntegerField(_("failed"), default=0)
    skipped = models.IntegerField(_("skipped"), default=0)
    cancelled = models.IntegerField(_("cancelled"), default=0)
    reattempts = models.IntegerField(_("reattempts"), default=0)
    durations = models.JSONField(_("durations"), default=dict)

    class Meta:
        abstract = True


class WorkflowStepHour(StepCounts):
    """The attempts of one step of one workflow class that finished in one hour (UTC)."""

    #: The hour's start; the row counts attempts with ``hour <= finished_at < hour + 1 h``.
    hour = models.DateTimeField(_("hour"))

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


class WorkflowStepSpan(StepCounts):
    """The attempts of one step of one workflow class that finished in one five-minute span: a window's start."""

    #: The span's start; the row counts attempts with ``start <= finished_at < start + 5 min``.
    start = models.DateTimeField(_("start"))

    objects = ReadingQuerySet["WorkflowStepSpan"].as_manager()

    class Meta:
        verbose_name = _("step span")
        verbose_name_plural = _("step spans")
        constraints = [
            models.UniqueConstraint(fields=["workflow_class", "start", "step_name"], name="pgbus_wf_step_span"),
        ]
        indexes = [models.Index(fields=["start"], name="pgbus_wf_step_span_age")]  # the sweep's expiry

    def __str__(self) -> str:
        return f"{self.workflow_class}.{self.step_name} {self.start:%Y-%m-%d %H:%M}"


class RunCounts(models.Model):
    """The finished and cancelled runs of one workflow class that started in one period, by step.

    For insights' funnel: ``reached`` counts those runs with an attempt of the step, ``finished``
    and ``cancelled`` those whose ``current_step`` is the step. A run is added once it has ended
    (and so will not change), by the time it ended (``status_changed_at``).
    """

    workflow_class = models.CharField(_("workflow class"), max_length=255)
    step_name = models.CharField(_("step"), max_length=255, blank=True)
    reached = models.IntegerField(_("reached"), default=0)
    finished = models.IntegerField(_("finished"), default=0)
    cancelled = models.IntegerField(_("cancelled"), default=0)

    class Meta:
        abstract = True


class WorkflowRunHour(RunCounts):
    """The ended runs of one workflow class that started in one hour (UTC), by step."""

    #: The start of the hour the runs started in.
    hour = models.DateTimeField(_("hour"))

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


class WorkflowRunSpan(RunCounts):
    """The ended runs of one workflow class that started in one five-minute span, by step: a window's start."""

    #: The start of the span the runs started in.
    start = models.DateTimeField(_("start"))

    objects = ReadingQuerySet["WorkflowRunSpan"].as_manager()

    class Meta:
        verbose_name = _("run span")
        verbose_name_plural = _("run spans")
        constraints = [
            models.UniqueConstraint(fields=["workflow_class", "start", "step_name"], name="pgbus_wf_run_span"),
        ]
        indexes = [models.Index(fields=["start"], name="pgbus_wf_run_span_age")]  # the sweep's expiry

    def __str__(self) -> str:
        return f"{self.workflow_class}.{self.step_name} started {self.start:%Y-%m-%d %H:%M}"


class WorkflowRollupMark(models.Model):
    """How far a rollup goes, and the checkpoint that lets it go further (a row each: ``step_hours``, ``run_hours``).

    ``rolled_until``: every attempt finished before it is counted in :class:`WorkflowStepHour`
    (``step_hours``), every run ended before it in :class:`WorkflowRunHour` (``run_hours``).
    ``checkpoint_at`` and ``checkpoint_xids``: a time and the transactions of the database that
    held a transaction id when it was taken; once all of those have ended, no attempt that
    finished before ``checkpoint_at`` can still commit, and the rollup may go up to it.
    ``spans_from``: the five-minute spans (:class:`WorkflowStepSpan`, :class:`WorkflowRunSpan`)
    count everything from it up to ``rolled_until`` (None: none yet, as just after an upgrade).
    """

    name = models.CharField(_("name"), max_length=32, primary_key=True)
    rolled_until = models.DateTimeField(_("rolled up until"), null=True, blank=True)
    checkpoint_at = models.DateTimeField(_("checkpoint at"), null=True, blank=True)
    checkpoint_xids = models.JSONField(_("checkpoint transactions"), default=list)
    spans_from = models.DateTimeField(_("spans from"), null=True, blank=True)

    # read where the hours are read (a replica's mark goes with its rows)
    objects = ReadingQuerySet["WorkflowRollupMark"].as_manager()

    class Meta:
        verbose_name = _("rollup mark")
        verbose_name_plural = _("rollup marks")

    def __str__(self) -> str:
        return f"{self.name} until {self.rolled_until}"
