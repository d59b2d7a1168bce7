"""Django's task API, from Django 6's ``django.tasks`` or, on Django 5.2, the ``django-tasks`` backport.

Everything the backend touches of the API comes through here, so the rest of the package
reads the same on both. On Django 5.2 without the backport, importing this module raises
``ImproperlyConfigured`` with the command that installs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:  # django-stubs types the API as Django 6 has it; the backport's is the same
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:
        from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    except ImportError:  # Django 5.2: the backport
        try:
            # Its import registers every backend's system check, as importing django.tasks does;
            # the backport itself does so in its app's ready(), and a project need not install it.
            import django_tasks.checks  # noqa: F401
            from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskError
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
            from django_tasks.utils import normalize_json
        except ImportError as missing:
            raise ImproperlyConfigured(
                "pgbus_workflows.tasks needs Django's task framework: Django 6, or on Django 5.2 "
                "the django-tasks backport (pip install 'pgbus-workflows[tasks]')."
            ) from missing

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
