"""What a run leaves and receives beside its steps (audit events, signals, fan-out jobs), and the live dispatchers.

Models are data and queries only; ``services/`` is the one place that changes them.
"""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..states import JobStatus, SignalStatus
from .reading import ReadingQuerySet
from .runs import WorkflowRun, WorkflowStep

#: Every kind of audit event a run records, with what it means. The docs' reference of event
#: kinds is drawn from it; a test holds it to the kinds the code writes.
EVENT_KINDS: dict[str, str] = {
    "started": "The run was started; its actor and reason are ``started_by()``'s (``system`` by default).",
    "debounced": "A debounced start moved the due time of the run's first step (its arguments are the latest).",
    "step_started": "A dispatcher claimed the step's attempt and its body began.",
    "step_completed": "The attempt's body returned: the run moves on to the next step.",
    "step_skipped": "The step was skipped: its skip condition, its exception policy, an operator, a removed step.",
    "step_failed": "The body raised and the step's policy paused or cancelled the run (the error is in details).",
    "step_reattempted": "The body raised and the step's policy retries it: a new attempt is due after a backoff.",
    "step_stalled": "The sweep found the attempt past its stall time, or its dispatcher dead; STALL_ACTION applied.",
    "step_waiting": "The step waits for a signal (``wait_for``), until one arrives or its ``wait_timeout`` passes.",
    "step_woken": "A waiting step was woken: its signal arrived, or an operator's run now cut the wait short.",
    "step_resolved": "A waiting step ended without its body running: its fan-out ended, it timed out or was skipped.",
    "step_rerouted": "A durable function reached a checkpoint whose queue, priority or limits are not its row's: "
    "the attempt went back to be claimed under the checkpoint's own.",
    "step_timed_out": "A ``wait_for`` step passed its ``wait_timeout`` with ``on_timeout='run'``: its body runs now.",
    "wait_timed_out": "A ``wait_for`` step passed its ``wait_timeout``; details name the ``on_timeout`` action taken.",
    "fan_out_started": "The step's fan-out recorded its jobs or child runs and the run waits for them.",
    "fan_out_ended": "The last member of a durable function's fan-out (``ctx.map``, ``ctx.child``) ended: its "
    "checkpoint runs again and reads their ends.",
    "child_reattached": "A reattempted fan-out found the child run an earlier attempt started, and kept it.",
    "signal_received": "A signal was sent to the run (its payload is on the signal row).",
    "signal_consumed": "A waiting step took a pending signal.",
    "signal_returned": "An attempt whose body never ran gave its signal back: it is pending again.",
    "outcome_discarded": "An outcome arrived for an attempt that no longer runs (cancelled, stalled): it is kept out.",
    "paused": "The run was paused: by an operator, by a step's policy, or for a step no dispatcher defines.",
    "resumed": "The run was resumed by an operator.",
    "resumed_at": "An operator resumed the run at another step.",
    "run_now": "An operator made the scheduled or waiting step due now.",
    "hold_released": "The sweep released the held attempt of a run whose pause had ended (a rolling deploy).",
    "rerun": "An operator started a new run with this run's arguments; details name it.",
    "forked": "An operator forked the run: a new run starts at a step with its earlier outputs; details name it.",
    "forked_from": "This run is a fork: details name the run it was forked from, its first step and the steps copied.",
    "step_copied": "A fork copied this completed step from the run it was forked from (details name both attempts).",
    "cancelled": "The run was cancelled: by an operator, or by a step's policy.",
    "finished": "The run's last step ended (or it had none): the run is finished.",
    "sweep_failed": "A sweep phase failed on this run; it retries later (the error is the reason).",
}

#: The event kinds an operator looks for (the verbs, failures, stalls, timeouts, skips): the
#: events list filters by them through a partial index that routine kinds (a step started or
#: completed, a run finished) never enter, so the index costs the hot path nothing.
NOTABLE_EVENT_KINDS = (
    "cancelled",
    "paused",
    "resumed",
    "resumed_at",
    "step_failed",
    "step_reattempted",
    "step_skipped",
    "step_stalled",
    "step_timed_out",
    "sweep_failed",
)


class WorkflowEvent(models.Model):
    """One line of a run's audit trail: a transition or an operator verb."""

    # db_index=False: pgbus_wf_event_run (run, id) serves lookups by run; one index less per write.
    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="events", verbose_name=_("run"), db_index=False
    )
    # db_index=False: pgbus_wf_event_step leaves out the run's own events (started, paused, finished...).
    step = models.ForeignKey(
        WorkflowStep,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="events",
        verbose_name=_("step"),
        db_index=False,
    )
    kind = models.CharField(_("kind"), max_length=64)
    transition = models.CharField(_("transition"), max_length=32, blank=True, default="")
    from_status = models.CharField(_("from status"), max_length=16, blank=True, default="")
    to_status = models.CharField(_("to status"), max_length=16, blank=True, default="")
    actor = models.CharField(_("actor"), max_length=255, blank=True, default="")
    reason = models.TextField(_("reason"), blank=True, default="")
    details = models.JSONField(_("details"), default=dict, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)

    objects = ReadingQuerySet["WorkflowEvent"].as_manager()

    class Meta:
        verbose_name = _("workflow event")
        verbose_name_plural = _("workflow events")
        ordering = ("id",)
        indexes = [
            models.Index(fields=["run", "id"], name="pgbus_wf_event_run"),
            models.Index(fields=["step"], condition=Q(step__isnull=False), name="pgbus_wf_event_step"),
            models.Index(
                fields=["kind", "id"], condition=Q(kind__in=NOTABLE_EVENT_KINDS), name="pgbus_wf_event_notable"
            ),
            # The idempotency keys of the starts that collapsed into a debounced run (services.debounce).
            models.Index(
                F("details__idempotency_key"), condition=Q(kind="debounced"), name="pgbus_wf_event_debounced_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor or 'system'}"


class WorkflowSignal(models.Model):
    """A named message delivered to a run, consumed once by a step that waits for it."""

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="signals", verbose_name=_("run"))
    name = models.CharField(_("name"), max_length=255)
    payload = models.JSONField(_("payload"), null=True, blank=True, encoder=DjangoJSONEncoder)
    idempotency_key = models.CharField(_("idempotency key"), max_length=255, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(_("status"), max_length=16, choices=SignalStatus.choices, default=SignalStatus.PENDING)
    consumed_by = models.ForeignKey(
        WorkflowStep,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("consumed by"),
    )
    actor = models.CharField(_("actor"), max_length=255, blank=True, default="")
    reason = models.TextField(_("reason"), blank=True, default="")
    received_at = models.DateTimeField(_("received at"), default=timezone.now)
    consumed_at = models.DateTimeField(_("consumed at"), null=True, blank=True)

    #: Set on the instance that ``signal()`` returns for a repeated idempotency key.
    duplicate_delivery = False

    objects = ReadingQuerySet["WorkflowSignal"].as_manager()

    class Meta:
        verbose_name = _("workflow signal")
        verbose_name_plural = _("workflow signals")
        ordering = ("id",)
        constraints = [
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgbus_wf_signal_unique_key",
            )
        ]
        indexes = [
            models.Index(fields=["run", "name", "status"], name="pgbus_wf_signal_pending"),
            # The signals list's "pending" filter: consumed signals never enter it.
            models.Index(fields=["id"], condition=Q(status=SignalStatus.PENDING), name="pgbus_wf_signal_unconsumed"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class Dispatcher(models.Model):
    """One live ``run_workflow_dispatcher`` process, kept fresh by its heartbeat."""

    name = models.CharField(_("name"), max_length=255, unique=True)
    hostname = models.CharField(_("hostname"), max_length=255)
    pid = models.PositiveIntegerField(_("pid"))
    queues = models.JSONField(_("queues"), default=list, blank=True)
    concurrency = models.PositiveIntegerField(_("concurrency"), default=1)
    #: Worker threads alive at the last heartbeat (one that died is replaced at once).
    workers_alive = models.PositiveIntegerField(_("workers alive"), default=0, db_default=0)
    #: ``{class name: step names}`` its code runs (``deploy.catalog``): the sweep pauses a run
    #: on a step that no live dispatcher knows only after ``UNKNOWN_STEP_GRACE``.
    catalog = models.JSONField(_("catalog"), default=dict, db_default={}, blank=True)
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    heartbeat_at = models.DateTimeField(_("heartbeat at"), default=timezone.now)
    #: Its LISTEN session holds the advisory lock of its name (``sql.session.hold_liveness_lock``):
    #: once that lock is free and the heartbeat a little stale, the process is gone.
    session_lock = models.BooleanField(_("session lock"), default=False, db_default=False)

    objects = ReadingQuerySet["Dispatcher"].as_manager()

    class Meta:
        verbose_name = _("dispatcher")
        verbose_name_plural = _("dispatchers")
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


UNFINISHED_JOB = (JobStatus.PENDING, JobStatus.RUNNING)
#: Jobs that ended other than succeeded (the jobs list's status filter walks a partial index of them).
UNSUCCESSFUL_JOB = (JobStatus.FAILED, JobStatus.CANCELLED)


class FanOutJob(models.Model):
    """One member of a fan-out: a module-level function of an installed app and its JSON arguments."""

    step = models.ForeignKey(WorkflowStep, on_delete=models.CASCADE, related_name="jobs", verbose_name=_("step"))
    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="jobs", verbose_name=_("run"))
    index = models.PositiveIntegerField(_("index"))
    function = models.CharField(_("function"), max_length=255)
    arguments = models.JSONField(_("arguments"), default=dict, encoder=DjangoJSONEncoder)
    status = models.CharField(_("status"), max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    max_attempts = models.PositiveIntegerField(_("max attempts"), default=1)
    #: Times it was put back because its dispatcher died or it ran past ``stall_at``: those
    #: claims do not count as attempts (the job may never have started); ``MAX_STALLS`` bounds them.
    # No CHECK (adding the column scans nothing); a database default, so that code deployed
    # before this column (a rolling deploy) can still insert jobs.
    stalls = models.IntegerField(_("stalls"), default=0, db_default=0)
    queue = models.CharField(_("queue"), max_length=255)
    priority = models.IntegerField(_("priority"), default=0)
    scheduled_at = models.DateTimeField(_("scheduled at"), default=timezone.now)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    stall_at = models.DateTimeField(_("stall at"), null=True, blank=True)
    claimed_by = models.CharField(_("claimed by"), max_length=255, blank=True, default="")
    result = models.JSONField(_("result"), null=True, blank=True, encoder=DjangoJSONEncoder)
    error = models.TextField(_("error"), blank=True, default="")

    objects = ReadingQuerySet["FanOutJob"].as_manager()

    class Meta:
        verbose_name = _("fan-out job")
        verbose_name_plural = _("fan-out jobs")
        ordering = ("step", "index")
        constraints = [
            models.UniqueConstraint(fields=["step", "index"], name="pgbus_wf_job_unique_index"),
            models.CheckConstraint(condition=Q(status__in=JobStatus.values), name="pgbus_wf_job_status_valid"),
        ]
        indexes = [
            # Serves the job claim query only.
            models.Index(
                fields=["priority", "scheduled_at", "id"],
                condition=Q(status=JobStatus.PENDING),
                name="pgbus_wf_job_due",
            ),
            # "Is any job of this step unfinished?" stops at the first entry: no count over 10,000 rows.
            models.Index(fields=["step"], condition=Q(status__in=UNFINISHED_JOB), name="pgbus_wf_job_unfinished"),
            models.Index(fields=["stall_at"], condition=Q(status=JobStatus.RUNNING), name="pgbus_wf_job_running"),
            models.Index(
                fields=["id"], condition=Q(status__in=sorted(UNSUCCESSFUL_JOB)), name="pgbus_wf_job_unsuccessful"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.function} #{self.index} ({self.status})"
