"""The runs and their step attempts: the rows the engine moves through their statuses.

Models are data and queries only; ``services/`` is the one place that changes them. The rows a
run leaves and receives beside its steps (events, signals, fan-out jobs) and the dispatchers'
rows are in ``records.py``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Case, F, Q, When
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..states import (
    ACTIVE_STEP,
    ONGOING_RUN,
    TERMINAL_RUN,
    RunStatus,
    StepOutcomeKind,
    StepStatus,
)
from .reading import ReadingQuerySet

#: Attempts that ended other than completed: rare next to completed ones, so a partial index
#: on them serves the steps list's status filter (a completed attempt is found by walking the ids).
UNSUCCESSFUL_STEP = (StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED)
#: A scheduled attempt's due time, NULL for any other: what the due index is keyed on, with
#: statistics of its own (``sql.due``), so a query of due steps is estimated from the scheduled
#: attempts alone, never from the whole history's ``scheduled_at``.
DUE_AT = Case(When(status=StepStatus.SCHEDULED, then=F("scheduled_at")))


class WorkflowRunQuerySet(ReadingQuerySet["WorkflowRun"]):
    """Domain queries over runs."""

    def ongoing(self) -> WorkflowRunQuerySet:
        """Runs that are neither finished nor cancelled."""
        return self.filter(status__in=ONGOING_RUN)

    def terminal(self) -> WorkflowRunQuerySet:
        """Finished and cancelled runs."""
        return self.filter(status__in=TERMINAL_RUN)

    def for_subject(self, subject_type: str | None, subject_id: str | None) -> WorkflowRunQuerySet:
        """Runs about one subject ("app_label.model", primary key as text)."""
        return self.filter(subject_type=subject_type, subject_id=subject_id)

    def count_by_status(self) -> dict[str, int]:
        """``{status: number of these runs}`` in one grouped query (statuses without runs left out)."""
        return dict(self.values_list("status").annotate(n=models.Count("pk")).order_by())


class WorkflowRun(models.Model):
    """One run of a workflow class: where it is, about what, with which arguments."""

    workflow_id = models.UUIDField(_("workflow id"), default=uuid.uuid4, unique=True, editable=False)
    # Indexed by pgbus_wf_run_class_status (no LIKE index: class names are matched whole).
    workflow_class = models.CharField(_("workflow class"), max_length=255)
    status = models.CharField(_("status"), max_length=16, choices=RunStatus.choices, default=RunStatus.READY)
    current_step = models.CharField(_("current step"), max_length=255, blank=True, default="")
    # NULL, not "": subject-less runs must not collide in the one-ongoing-per-subject constraint.
    subject_type = models.CharField(_("subject type"), max_length=255, null=True, blank=True)  # noqa: DJ001
    subject_id = models.CharField(_("subject id"), max_length=255, null=True, blank=True)  # noqa: DJ001
    arguments = models.JSONField(_("arguments"), default=dict, encoder=DjangoJSONEncoder)
    idempotency_key = models.CharField(_("idempotency key"), max_length=255, null=True, blank=True)  # noqa: DJ001
    allow_multiple = models.BooleanField(_("allow multiple"), default=False)
    rerun_of = models.UUIDField(_("rerun of"), null=True, blank=True)
    #: Set on a run ``fork()`` started: the ``workflow_id`` of the run whose earlier steps' outputs it copied.
    forked_from = models.UUIDField(_("forked from"), null=True, blank=True)
    paused_reason = models.TextField(_("paused reason"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    status_changed_at = models.DateTimeField(_("status changed at"), default=timezone.now)
    #: Set on a run a schedule started: the schedule, and the tick (the time it was due) it fired for.
    # db_index=False: pgbus_wf_one_run_per_tick (schedule, scheduled_for) serves lookups by schedule.
    schedule = models.ForeignKey(
        "pgbus_workflows.WorkflowSchedule",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="runs",
        verbose_name=_("schedule"),
        db_index=False,
    )
    scheduled_for = models.DateTimeField(_("scheduled for"), null=True, blank=True)
    #: Set on a child run (a ``Child`` of a fan-out step): the parent run, and the fan-out job
    #: that stands for this child in the parent's step (its end is recorded there).
    # db_index=False: the partial indexes below hold only child runs (most runs have no parent).
    parent = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="children",
        verbose_name=_("parent run"),
        db_index=False,
    )
    parent_job = models.ForeignKey(
        "pgbus_workflows.FanOutJob",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("parent's fan-out job"),
        db_index=False,
    )
    #: What the parent's end does to this child while it is ongoing: "cancel" or "abandon" ("" for a top run).
    # Database defaults: code deployed before these columns (a rolling deploy) can still insert runs.
    parent_close = models.CharField(_("parent close"), max_length=16, blank=True, default="", db_default="")
    #: 0 for a run started by code, the parent's depth + 1 for a child (``MAX_CHILD_DEPTH`` bounds it).
    depth = models.PositiveSmallIntegerField(_("depth"), default=0, db_default=0)
    #: Set by ``result()``: the transaction that ends the run then NOTIFYs (no NOTIFY for other runs).
    awaited = models.BooleanField(_("awaited"), default=False, db_default=False)
    #: The caller's trace context at ``start()`` (``tracing.carrier``), restored around each attempt.
    trace_context = models.JSONField(_("trace context"), null=True, blank=True, editable=False)
    #: Set on a run a debounced class's ``start()`` created: later starts of this key collapse into
    #: it until its first step begins (``Debounce``); NULL for every other run.
    debounce_key = models.CharField(  # noqa: DJ001
        _("debounce key"), max_length=255, null=True, blank=True, editable=False
    )

    objects = WorkflowRunQuerySet.as_manager()

    class Meta:
        verbose_name = _("workflow run")
        verbose_name_plural = _("workflow runs")
        ordering = ("-id",)
        constraints = [
            models.UniqueConstraint(
                fields=["workflow_class", "subject_type", "subject_id"],
                condition=Q(allow_multiple=False) & Q(status__in=sorted(ONGOING_RUN)),
                name="pgbus_wf_one_ongoing_per_subject",
                violation_error_message=_("This subject already has an ongoing run of this workflow."),
            ),
            models.UniqueConstraint(
                fields=["workflow_class", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgbus_wf_unique_idempotency_key",
            ),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="pgbus_wf_run_status_valid"),
            # A tick starts exactly one run: the database refuses a second, whoever fires it.
            models.UniqueConstraint(
                fields=["schedule", "scheduled_for"],
                condition=Q(schedule__isnull=False),
                name="pgbus_wf_one_run_per_tick",
            ),
        ]
        indexes = [
            models.Index(fields=["workflow_class", "status"], name="pgbus_wf_run_class_status"),
            models.Index(fields=["subject_type", "subject_id"], name="pgbus_wf_run_subject"),
            models.Index(
                fields=["status_changed_at"],
                condition=Q(status__in=sorted(TERMINAL_RUN)),
                name="pgbus_wf_run_retention",
            ),
            models.Index(fields=["parent", "id"], condition=Q(parent__isnull=False), name="pgbus_wf_run_children"),
            models.Index(fields=["parent_job"], condition=Q(parent_job__isnull=False), name="pgbus_wf_run_parent_job"),
            # Only a debounced class's ready runs: the run a start may collapse into, found by its key.
            models.Index(
                fields=["workflow_class", "debounce_key"],
                condition=Q(debounce_key__isnull=False) & Q(status=RunStatus.READY),
                name="pgbus_wf_run_debounce",
            ),
            # The insights page: ongoing runs by step (the pipeline) and those a window started (the
            # funnel's runs not rolled up), and the runs a window started, each read from the index alone.
            models.Index(
                fields=["workflow_class", "started_at", "current_step", "status", "id"],
                condition=Q(status__in=sorted(ONGOING_RUN)),
                name="pgbus_wf_run_pipeline",
            ),
            models.Index(
                fields=["workflow_class", "started_at", "current_step", "status", "id"],  # no INCLUDE: SQLite has none
                name="pgbus_wf_run_class_started",
            ),
        ]
        permissions = [
            ("pause_workflowrun", _("Can pause and resume workflow runs")),
            ("cancel_workflowrun", _("Can cancel workflow runs")),
            ("rerun_workflowrun", _("Can rerun workflow runs")),
            ("run_now_workflowrun", _("Can run a workflow run's step now")),
            ("skip_workflowrun", _("Can skip a workflow run's step")),
            ("signal_workflowrun", _("Can deliver signals to workflow runs")),
            ("hold_workflowrun", _("Can hold and release a workflow class or a queue")),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_class} {self.workflow_id} ({self.status})"

    def start_audit(self) -> tuple[str, str] | None:
        """``(actor, reason)`` of the run's ``started`` event: who started it and why (None: no event kept)."""
        return self.events.filter(kind="started").order_by("pk").values_list("actor", "reason").first()


class WorkflowStepQuerySet(ReadingQuerySet["WorkflowStep"]):
    """Domain queries over step attempts."""

    def active(self) -> WorkflowStepQuerySet:
        """Attempts that are scheduled, in progress or waiting (at most one per run)."""
        return self.filter(status__in=ACTIVE_STEP)

    def due(self, now: datetime | None = None) -> WorkflowStepQuerySet:
        """Scheduled attempts whose time has come (but those a pause holds)."""
        return self.filter(status=StepStatus.SCHEDULED, held=False, scheduled_at__lte=now or timezone.now())


class WorkflowStep(models.Model):
    """One attempt of one step of a run. The steps table is the queue."""

    # db_index=False: pgbus_wf_step_run_name (run, step_name) serves lookups by run; one index less per write.
    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="steps", verbose_name=_("run"), db_index=False
    )
    step_name = models.CharField(_("step name"), max_length=255)
    attempt = models.PositiveIntegerField(_("attempt"), default=1)
    status = models.CharField(_("status"), max_length=16, choices=StepStatus.choices, default=StepStatus.SCHEDULED)
    outcome = models.CharField(_("outcome"), max_length=16, choices=StepOutcomeKind.choices, blank=True, default="")
    reattempt_reason = models.CharField(_("reattempt reason"), max_length=32, blank=True, default="")
    queue = models.CharField(_("queue"), max_length=255)
    priority = models.IntegerField(_("priority"), default=0)
    scheduled_at = models.DateTimeField(_("scheduled at"), default=timezone.now)
    #: A scheduled attempt of a paused run: out of the claims' way (the due index orders it
    #: after its priority's claimable attempts) until the run resumes. Written under the run's
    #: lock with every move into or out of a pause (``RunLedger.flush``); the database's own
    #: default keeps the inserts of code older than the column working in a rolling deploy.
    held = models.BooleanField(_("held by a pause"), default=False, db_default=False)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    timeout = models.DurationField(_("timeout"), null=True, blank=True)
    stall_at = models.DateTimeField(_("stall at"), null=True, blank=True)
    claimed_by = models.CharField(_("claimed by"), max_length=255, blank=True, default="")
    output = models.JSONField(_("output"), null=True, blank=True, encoder=DjangoJSONEncoder)
    error_class = models.CharField(_("error class"), max_length=255, blank=True, default="")
    error_message = models.TextField(_("error message"), blank=True, default="")
    traceback = models.TextField(_("traceback"), blank=True, default="")
    wait_for = models.JSONField(_("waits for"), null=True, blank=True)
    waiting_since = models.DateTimeField(_("waiting since"), null=True, blank=True)
    timeout_at = models.DateTimeField(_("timeout at"), null=True, blank=True)
    timed_out = models.BooleanField(_("timed out"), default=False)
    # db_index=False: pgbus_wf_step_signal holds only the attempts that received one (few do).
    signal = models.ForeignKey(
        "WorkflowSignal",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("received signal"),
        db_index=False,
    )
    #: The names of the limiters (``WorkflowLimiter``) this attempt is under, or None: a step
    #: of a class without ``Concurrency`` or ``RateLimit``, which the claim takes as before.
    limiters = models.JSONField(_("limiters"), null=True, blank=True)
    #: A cancelled attempt whose body may still run: it keeps its concurrency slots until the
    #: body returns or the sweep finds it stalled (``services.slots``). In progress, an attempt
    #: holds them by its status alone.
    holds_slots = models.BooleanField(_("holds its slots"), default=False, db_default=False)
    #: A scheduled attempt that a claim found held back by a limiter with no room: out of the
    #: claims' range (the due index orders it after its priority's claimable attempts) until a
    #: claim finds room in ``parked_on`` (the limiter's name) and puts it back, in priority and
    #: due order (``sql.limiting``). The database's own default keeps older code's inserts working.
    parked = models.BooleanField(_("parked by a limit"), default=False, db_default=False)
    parked_on = models.CharField(_("parked on"), max_length=300, blank=True, default="", db_default="")
    #: A step of a class with ``Fairness``: its key, and its place in the claims' order (its due
    #: time, or a quantum / weight after its key's last waiting step, whichever is later:
    #: ``sql.fairness``; a step scheduled for later is placed at its due time by a claim once
    #: due). Empty and NULL for every other step, which the claim orders by its due time. The
    #: database's own default keeps older code's inserts working.
    fair_key = models.CharField(_("fairness key"), max_length=255, blank=True, default="", db_default="")
    fair_at = models.DateTimeField(_("fair order"), null=True, blank=True)
    #: Set on a fan-out attempt: how many jobs it opened.
    fan_out_total = models.PositiveIntegerField(_("fan-out jobs"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)

    objects = WorkflowStepQuerySet.as_manager()

    #: In memory only, never a column: what the outcome whose transaction claimed this attempt
    #: for its worker handed it (a durable function's recorded checkpoints, so the function's
    #: next call replays them without reading them again; ``services.applying``).
    carried: Any = None

    class Meta:
        verbose_name = _("workflow step")
        verbose_name_plural = _("workflow steps")
        ordering = ("id",)
        constraints = [
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(status__in=sorted(ACTIVE_STEP)),
                name="pgbus_wf_one_active_step_per_run",
                violation_error_message=_("A run has at most one active step."),
            ),
            models.CheckConstraint(condition=Q(status__in=StepStatus.values), name="pgbus_wf_step_status_valid"),
        ]
        indexes = [
            # Serves the claim query only: finished history never enters it, and a paused run's
            # attempt (``held``) or one parked by a limit with no room (``parked``) sits after its
            # priority's claimable ones, out of every claim's range. Keyed on the due time of a
            # scheduled attempt alone, which has statistics of its own (``sql.due``).
            models.Index(
                F("priority"),
                F("held"),
                F("parked"),
                DUE_AT,
                F("id"),
                condition=Q(status=StepStatus.SCHEDULED),
                name="pgbus_wf_step_due",
            ),
            # The parked attempts, a key's in the order they are put back (and counted, the index alone read).
            models.Index(
                fields=["parked_on", "priority", "scheduled_at", "id"],
                include=["step_name", "run"],
                condition=Q(status=StepStatus.SCHEDULED, parked=True),
                name="pgbus_wf_step_parked",
            ),
            models.Index(
                fields=["stall_at"], condition=Q(status=StepStatus.IN_PROGRESS), name="pgbus_wf_step_in_progress"
            ),
            models.Index(fields=["timeout_at"], condition=Q(status=StepStatus.WAITING), name="pgbus_wf_step_waiting"),
            models.Index(fields=["run", "step_name"], name="pgbus_wf_step_run_name"),
            # The dashboard's "last hour" and the steps list's "finished within" filter.
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False), name="pgbus_wf_step_finished"),
            models.Index(
                fields=["id"], condition=Q(status__in=sorted(UNSUCCESSFUL_STEP)), name="pgbus_wf_step_unsuccessful"
            ),
            models.Index(fields=["signal"], condition=Q(signal__isnull=False), name="pgbus_wf_step_signal"),
            # What holds steps back (the gauge, the dashboard), and the claims' parking: only claimable
            # attempts under limits, none parked.
            # (Not held: a test of ``held`` no other query of limiters makes keeps it theirs.)
            models.Index(
                fields=["scheduled_at"],
                condition=Q(status=StepStatus.SCHEDULED, limiters__isnull=False, held=False, parked=False),
                name="pgbus_wf_step_limited",
            ),
            # The claims of a catalog with ``Fairness``: the tagged claimable attempts in fair order.
            models.Index(
                fields=["priority", "fair_at", "scheduled_at", "id"],
                condition=Q(status=StepStatus.SCHEDULED, fair_at__isnull=False, held=False, parked=False),
                name="pgbus_wf_step_fair",
            ),
            # The keyed attempts scheduled for later, with no place yet: a claim places them as they come due.
            models.Index(
                fields=["scheduled_at"],
                condition=Q(
                    status=StepStatus.SCHEDULED, fair_at__isnull=True, fair_key__gt="", held=False, parked=False
                ),
                name="pgbus_wf_step_fair_later",
            ),
            # A key's last waiting tagged attempt (where its next one goes).
            models.Index(
                fields=["fair_key", "fair_at"],
                condition=Q(status=StepStatus.SCHEDULED, fair_at__isnull=False),
                name="pgbus_wf_step_fair_key",
            ),
            # The cancelled attempts that still hold slots (the sweep gives back a stalled one's).
            models.Index(fields=["stall_at"], condition=Q(holds_slots=True), name="pgbus_wf_step_holds_slots"),
        ]

    def __str__(self) -> str:
        return f"{self.step_name} #{self.attempt} ({self.status})"
