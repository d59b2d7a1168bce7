"""pgbus-workflows: durable multi-step workflows for Django, stored in PostgreSQL.

Import the public API from here::

    from pgbus_workflows import Workflow, OnException, Schedule, Concurrency, RateLimit, Debounce, backoff, step
"""

from importlib.metadata import PackageNotFoundError, version

from .dsl.backoff import backoff
from .dsl.debounce import Debounce
from .dsl.decorators import fan_out, removed_step, step
from .dsl.definitions import OnException
from .dsl.jobs import Child, Job
from .dsl.limits import Concurrency, RateLimit
from .dsl.schedules import Schedule
from .exceptions import (
    AlreadyRunning,
    ChildConflict,
    ChildDepthExceeded,
    ConfigurationError,
    FanOutFailed,
    IdempotencyConflict,
    InvalidTransition,
    NonDeterministicRun,
    NotInStep,
    NotMigrated,
    NotOngoing,
    NotPaused,
    PayloadNotSerializable,
    PayloadTooLarge,
    StepFailed,
    StepNotDefined,
    StepStalled,
    StepWaiting,
    UnknownSignal,
    WaitTimedOut,
    WorkflowCancelled,
    WorkflowError,
)
from .functions import durable
from .workflow import Workflow

try:
    __version__ = version("pgbus-workflows")
except PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.0.0"

__all__ = [
    "AlreadyRunning",
    "Child",
    "ChildConflict",
    "ChildDepthExceeded",
    "Concurrency",
    "ConfigurationError",
    "Debounce",
    "FanOutFailed",
    "IdempotencyConflict",
    "InvalidTransition",
    "Job",
    "NonDeterministicRun",
    "NotInStep",
    "NotMigrated",
    "NotOngoing",
    "NotPaused",
    "OnException",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "RateLimit",
    "Schedule",
    "StepFailed",
    "StepNotDefined",
    "StepStalled",
    "StepWaiting",
    "UnknownSignal",
    "WaitTimedOut",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowError",
    "__version__",
    "backoff",
    "durable",
    "fan_out",
    "removed_step",
    "step",
]
