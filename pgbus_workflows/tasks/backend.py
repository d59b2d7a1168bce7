"""``WorkflowsBackend``: Django's task backend API on this app's tables and dispatchers.

    TASKS = {"default": {"BACKEND": "pgbus_workflows.tasks.WorkflowsBackend", "QUEUES": ["default", "emails"]}}

``enqueue`` starts a run of the alias's task class (:mod:`.runs`) in the caller's transaction:
a rolled-back request enqueues nothing, and a dispatcher sees the task when it commits (the
start's NOTIFY goes with the commit). The dispatchers run it as any step.

The app's models are imported when a task is enqueued or read, not with this module: a
project that names the backend without installing the app gets a check message, not a crash.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ..exceptions import ConfigurationError
from .api import BaseTaskBackend, Task, TaskResult, TaskResultStatus, normalize_json, task_enqueued
from .fairness import TaskFairness, resolved
from .options import checked_options

#: What the backend's check, ``enqueue`` and ``get_result`` say when the app is not installed.
NOT_INSTALLED = "add 'pgbus_workflows' to INSTALLED_APPS: its dispatchers run the tasks, its tables hold them"


class WorkflowsBackend(BaseTaskBackend):
    """Tasks stored and claimed like workflow steps, run by ``manage.py run_workflow_dispatcher``.

    ``OPTIONS``: ``ATTEMPTS`` (how many times a failing task runs, default 1), ``BACKOFF``
    (the wait before the second attempt, doubling with jitter after: seconds, a timedelta or
    ``backoff(...)``; default 10 s) and ``FAIRNESS`` (``{"KEY": ..., "WEIGHT": ...}``: tasks
    claimed in turn by a key read from their arguments, :mod:`.fairness`; default none).
    """

    #: Marks this backend (and subclasses) for the app's ``ready()``, which makes each alias's class.
    serves_workflow_tasks = True
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._options_error: ConfigurationError | None = None
        self._fairness: TaskFairness | None = None
        try:
            self._fairness = checked_options(self.options).fairness
        except ConfigurationError as error:
            self._options_error = error  # check() reports it; enqueue raises it

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Store the task to run (in the caller's transaction); its ``TaskResult``, status READY.

        Arguments that are not JSON raise the API's own ``TypeError`` or ``ValueError``
        (``normalize_json``) before anything is written.
        """
        self.validate_task(task)
        if not apps.is_installed("pgbus_workflows"):
            raise ImproperlyConfigured(f"{type(self).__name__}: {NOT_INSTALLED}")
        if self._options_error is not None:
            raise self._options_error
        if self._fairness is not None:
            resolved(self._fairness)  # a FAIRNESS path that does not import: ConfigurationError, nothing written
        from ..services.start import start_run  # the app's models: see the module's docstring
        from ..sql import clock
        from .runs import task_workflow

        cls = task_workflow(self.alias, self.options)
        stored_args: list[Any] = normalize_json(list(args))  # type: ignore[assignment]
        stored_kwargs: dict[str, Any] = normalize_json(dict(kwargs))  # type: ignore[assignment]
        run_after = task.run_after
        # A past run_after is due since then, not since now: of one priority, tasks run in the
        # order they became due (the claim's), whenever they were enqueued.
        delay = None if run_after is None else run_after - clock.now()
        arguments = {
            "task": task.module_path,
            "args": stored_args,
            "kwargs": stored_kwargs,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "run_after": None if run_after is None else run_after.isoformat(),
            "backend": self.alias,
        }
        handle = start_run(cls, None, arguments=arguments, delay=delay)
        run = handle.record
        result: TaskResult = TaskResult(
            task=task,
            id=str(run.workflow_id),
            status=TaskResultStatus.READY,
            enqueued_at=run.created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=stored_args,
            kwargs=stored_kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as stored now; ``TaskResultDoesNotExist`` for an id this alias never gave."""
        if not apps.is_installed("pgbus_workflows"):
            raise ImproperlyConfigured(f"{type(self).__name__}: {NOT_INSTALLED}")
        from .results import get_result

        return get_result(self.alias, result_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """The app installed, the backend's ``OPTIONS`` (``FAIRNESS``' paths imported), and the API's own checks."""
        messages = list(super().check(**kwargs))
        if not apps.is_installed("pgbus_workflows"):
            message = f"TASKS[{self.alias!r}] uses {type(self).__name__}, but pgbus_workflows is not installed"
            messages.append(checks.Error(message, hint=NOT_INSTALLED, id="pgbus_workflows.E015", obj=type(self)))
        error = self._options_error
        if error is None and self._fairness is not None:
            try:
                resolved(self._fairness)  # imported here, at startup: not when a task module makes the backend
            except ConfigurationError as failed:
                error = failed
        if error is not None:
            messages.append(checks.Error(f"TASKS[{self.alias!r}]: {error}", id="pgbus_workflows.E013", obj=type(self)))
        return messages
