"""The benchmark's tasks on ``pgbus_workflows.tasks.WorkflowsBackend`` (this project's virtualenv)."""

from .common_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "pgbus_workflows"]  # noqa: F405
TASKS = {"default": {"BACKEND": "pgbus_workflows.tasks.WorkflowsBackend"}}
