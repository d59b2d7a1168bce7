"""Django's task framework run by this app's dispatchers (``django.tasks``; on Django 5.2, ``django-tasks``).

TASKS = {"default": {"BACKEND": "pgbus_workflows.tasks.WorkflowsBackend", "QUEUES": ["default", "emails"]}}
"""

from .backend import WorkflowsBackend

__all__ = ["WorkflowsBackend"]
