"""The rows: runs, step attempts, audit events, signals, fan-out jobs, live dispatchers, schedules, holds.

Models are data and queries only; ``services/`` is the one place that changes them. This
package's modules split them by role (``runs``: runs and step attempts; ``records``: events,
signals, fan-out jobs, dispatchers; ``schedules``; ``limiters``; ``holds``; ``rollups``: insights'
counts per class, step and hour); every name is re-exported here, so
``pgbus_workflows.models`` stays the one import path (and Django finds every model through it).
"""

from ..states import (
    ACTIVE_STEP,
    ONGOING_RUN,
    TERMINAL_RUN,
    JobStatus,
    RunStatus,
    SignalStatus,
    StepOutcomeKind,
    StepStatus,
)
from .holds import HoldKind, WorkflowHold, WorkflowHoldQuerySet
from .limiters import WorkflowLimiter
from .records import (
    EVENT_KINDS,
    NOTABLE_EVENT_KINDS,
    UNFINISHED_JOB,
    UNSUCCESSFUL_JOB,
    Dispatcher,
    FanOutJob,
    WorkflowEvent,
    WorkflowSignal,
)
from .rollups import WorkflowRollupMark, WorkflowRunHour, WorkflowRunSpan, WorkflowStepHour, WorkflowStepSpan
from .runs import DUE_AT, UNSUCCESSFUL_STEP, WorkflowRun, WorkflowRunQuerySet, WorkflowStep, WorkflowStepQuerySet
from .schedules import ScheduleEvent, WorkflowSchedule
from .tasks import TASK_CLASS_PREFIX, DjangoTask

__all__ = [
    "ACTIVE_STEP",
    "DUE_AT",
    "EVENT_KINDS",
    "NOTABLE_EVENT_KINDS",
    "ONGOING_RUN",
    "TASK_CLASS_PREFIX",
    "TERMINAL_RUN",
    "UNFINISHED_JOB",
    "UNSUCCESSFUL_JOB",
    "UNSUCCESSFUL_STEP",
    "Dispatcher",
    "DjangoTask",
    "FanOutJob",
    "HoldKind",
    "JobStatus",
    "RunStatus",
    "ScheduleEvent",
    "SignalStatus",
    "StepOutcomeKind",
    "StepStatus",
    "WorkflowEvent",
    "WorkflowHold",
    "WorkflowHoldQuerySet",
    "WorkflowLimiter",
    "WorkflowRollupMark",
    "WorkflowRun",
    "WorkflowRunHour",
    "WorkflowRunQuerySet",
    "WorkflowRunSpan",
    "WorkflowSchedule",
    "WorkflowSignal",
    "WorkflowStep",
    "WorkflowStepHour",
    "WorkflowStepQuerySet",
    "WorkflowStepSpan",
]
