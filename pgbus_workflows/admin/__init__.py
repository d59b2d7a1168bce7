"""The operator console, which Django's admin autodiscovers as ``pgbus_workflows.admin``.

Importing the package registers every ``ModelAdmin``: ``runs`` (the runs), ``records`` (their
attempts, events, signals, jobs and the dispatchers), ``limiters``, ``schedules`` and ``tasks``. The classes are
re-exported so that
``from pgbus_workflows.admin import WorkflowRunAdmin`` keeps working for projects that
subclass or re-register them.
"""

from .limiters import WorkflowLimiterAdmin
from .records import (
    DispatcherAdmin,
    FanOutJobAdmin,
    ReadOnlyAdmin,
    WorkflowEventAdmin,
    WorkflowSignalAdmin,
    WorkflowStepAdmin,
)
from .runs import RUN_FIELDS, RUN_READONLY, WorkflowRunAdmin
from .schedules import WorkflowScheduleAdmin
from .tasks import DjangoTaskAdmin

__all__ = [
    "RUN_FIELDS",
    "RUN_READONLY",
    "DispatcherAdmin",
    "DjangoTaskAdmin",
    "FanOutJobAdmin",
    "ReadOnlyAdmin",
    "WorkflowEventAdmin",
    "WorkflowLimiterAdmin",
    "WorkflowRunAdmin",
    "WorkflowScheduleAdmin",
    "WorkflowSignalAdmin",
    "WorkflowStepAdmin",
]
