"""pgbus-workflows: durable multi-step workflows for Django, stored in PostgreSQL.

Import the public API from here::

    from pgbus_workflows import Workflow, OnException, Schedule, step, removed_step
"""

from importlib.metadata import PackageNotFoundError, version

from .definitions import OnException, fan_out, removed_step, step
from .exceptions import (
    AlreadyRunning,
    ConfigurationError,
    FanOutFailed,
    IdempotencyConflict,
    InvalidTransition,
    NotInStep,
    NotMigrated,
    NotOngoing,
    NotPaused,
    PayloadNotSerializable,
    PayloadTooLarge,
    StepNotDefined,
    StepStalled,
    StepWaiting,
    UnknownSignal,
    WaitTimedOut,
    WorkflowError,
)
from .jobs import Job
from .schedules import Schedule
from .workflow import Workflow

try:
    __version__ = version("pgbus-workflows")
except PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.0.0"

__all__ = [
    "AlreadyRunning",
    "ConfigurationError",
    "FanOutFailed",
    "IdempotencyConflict",
    "InvalidTransition",
    "Job",
    "NotInStep",
    "NotMigrated",
    "NotOngoing",
    "NotPaused",
    "OnException",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "Schedule",
    "StepNotDefined",
    "StepStalled",
    "StepWaiting",
    "UnknownSignal",
    "WaitTimedOut",
    "Workflow",
    "WorkflowError",
    "__version__",
    "fan_out",
    "removed_step",
    "step",
]
