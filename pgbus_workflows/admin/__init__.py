"""The operator console, which Django's admin autodiscovers as ``pgbus_workflows.admin``.

Importing the package registers every ``ModelAdmin`` (``runs`` registers the runs and their
rows and imports ``schedules``); the classes are re-exported so that
``from pgbus_workflows.admin import WorkflowRunAdmin`` keeps working for projects that
subclass or re-register them.
"""

from .runs import (
    RUN_FIELDS,
    RUN_READONLY,
    DispatcherAdmin,
    FanOutJobAdmin,
    ReadOnlyAdmin,
    WorkflowEventAdmin,
    WorkflowRunAdmin,
    WorkflowSignalAdmin,
    WorkflowStepAdmin,
)
from .schedules import WorkflowScheduleAdmin

__all__ = [
    "RUN_FIELDS",
    "RUN_READONLY",
    "DispatcherAdmin",
    "FanOutJobAdmin",
    "ReadOnlyAdmin",
    "WorkflowEventAdmin",
    "WorkflowRunAdmin",
    "WorkflowScheduleAdmin",
    "WorkflowSignalAdmin",
    "WorkflowStepAdmin",
]
