"""pgbus-workflows: durable multi-step workflows for Django, stored in PostgreSQL.

Import the public API from here::

    from pgbus_workflows import Workflow, OnException, Schedule, Concurrency, RateLimit, Debounce, backoff, step
"""

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .dsl.backoff import backoff
from .dsl.debounce import Debounce
from .dsl.decorators import fan_out, removed_step, step
from .dsl.definitions import AttemptRoute, OnException
from .dsl.fairness import Fairness
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

if TYPE_CHECKING:
    from .services.holding import hold_class, hold_queue, release_class, release_queue

#: Names loaded when first used: their module reads the models, which exist once Django's apps are ready.
_LAZY = {"hold_class", "hold_queue", "release_class", "release_queue"}


def __getattr__(name: str) -> Any:
    """The holding functions (``services.holding``), imported on first use."""
    if name in _LAZY:
        from .services import holding

        return getattr(holding, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


try:
    __version__ = version("pgbus-workflows")
except PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.0.0"

__all__ = [
    "AlreadyRunning",
    "AttemptRoute",
    "Child",
    "ChildConflict",
    "ChildDepthExceeded",
    "Concurrency",
    "ConfigurationError",
    "Debounce",
    "Fairness",
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
    "hold_class",
    "hold_queue",
    "release_class",
    "release_queue",
    "removed_step",
    "step",
]
