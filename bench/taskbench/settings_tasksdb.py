"""The benchmark's tasks on django-tasks-db's ``DatabaseBackend`` (``bench/.peers/tasksdb-venv``)."""

from .common_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks", "django_tasks_db"]  # noqa: F405
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
