"""An enqueued task is a run: one step that calls the task's function, claimed like any step.

Each backend alias has a workflow class of its own, ``django_task.<alias>`` (built by
:func:`task_workflow` from the alias's ``OPTIONS``: how many attempts, how long between them),
so a task gets everything a step has: the SKIP LOCKED claim, heartbeats, stall recovery, the
SIGTERM grace, retention, the admin and the CLI. The run's arguments hold the task's path and
arguments, its queue and priority (each attempt is routed by them) and the backend's alias.
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any

from ..dsl.backoff import Backoff, backoff
from ..dsl.decorators import step
from ..dsl.definitions import OnException, StepDefinition
from ..exceptions import ConfigurationError
from ..models import TASK_CLASS_PREFIX, WorkflowRun
from ..workflow import Workflow
from .results import context_of, finished, running_result, task_of

#: ``OPTIONS`` keys and their defaults: one attempt (the API retries nothing), then 10 s, doubling.
DEFAULT_OPTIONS: dict[str, Any] = {"ATTEMPTS": 1, "BACKOFF": 10}


class TaskRun(Workflow):
    """The run of one enqueued task (subclassed per backend alias by :func:`task_workflow`)."""

    abstract = True
    allow_multiple = True
    #: The backend alias whose tasks this class runs.
    alias = ""

    @classmethod
    def _attempt_route(cls, definition: StepDefinition, run: WorkflowRun) -> tuple[str, int]:
        """A task's attempts go to its ``queue_name``, before lower ``priority`` (ours: lower first)."""
        return run.arguments["queue_name"], -int(run.arguments["priority"])

    @step
    def call(self) -> Any:
        """Call the task's function (with its context first when it takes one); its value is the output.

        Sends the API's ``task_started`` before and ``task_finished`` after the function (for
        an ``async def`` one, once it was awaited), as Django's own backends do.
        """
        from .api import TaskResultStatus, task_finished, task_started

        step = self._step_context("a task").step
        task = task_of(self.arguments, self.alias)
        result = running_result(self.record, step)
        task_started.send(type(self), task_result=result)
        arguments = list(self.arguments["args"])
        if task.takes_context:
            arguments.insert(0, context_of(result))
        try:
            value = task.func(*arguments, **self.arguments["kwargs"])
            if inspect.isawaitable(value):
                return _awaited(value, result)
            value = normalize_json(value)
        except BaseException:
            task_finished.send(type(self), task_result=finished(result, TaskResultStatus.FAILED))
            raise
        task_finished.send(type(self), task_result=finished(result, TaskResultStatus.SUCCESSFUL, value))
        return value


async def _awaited(coroutine: Any, result: Any) -> Any:
    from .api import TaskResultStatus, task_finished

    try:
        value = normalize_json(await coroutine)
    except BaseException:
        task_finished.send(TaskRun, task_result=finished(result, TaskResultStatus.FAILED))
        raise
    task_finished.send(TaskRun, task_result=finished(result, TaskResultStatus.SUCCESSFUL, value))
    return value


def normalize_json(value: Any) -> Any:
    """The API's own JSON check of a return value (a set, an object: ``TypeError``)."""
    from .api import normalize_json as normalized

    return normalized(value)


_classes: dict[str, type[TaskRun]] = {}


def task_workflow(alias: str, options: dict[str, Any] | None = None) -> type[TaskRun]:
    """The workflow class of ``alias``'s tasks, made (and registered) on first use or when its options change.

    Bad ``OPTIONS`` raise ``ConfigurationError`` (the backend's ``check()`` reports them).
    """
    attempts, wait = checked_options(options or {})
    known = _classes.get(alias)
    if known is not None and known.options == (attempts, wait):  # type: ignore[attr-defined]
        return known
    policies = [OnException(action="cancel")]
    if attempts > 1:
        policies = [OnException(action="reattempt", max_reattempts=attempts - 1, wait=wait, terminal_action="cancel")]
    namespace = {
        "__module__": __name__,
        "__qualname__": f"TaskRun[{alias}]",
        "name": f"{TASK_CLASS_PREFIX}{alias}",
        "alias": alias,
        "options": (attempts, wait),
        "exception_policies": policies,
    }
    cls: type[TaskRun] = type(f"TaskRun[{alias}]", (TaskRun,), namespace)
    _classes[alias] = cls
    return cls


def checked_options(options: dict[str, Any]) -> tuple[int, Backoff]:
    """``(attempts, backoff)`` of a backend's ``OPTIONS``; ``ConfigurationError`` on anything else."""
    if not isinstance(options, dict):
        raise ConfigurationError(f"OPTIONS must be a dict, got {options!r}")
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ConfigurationError(f"OPTIONS has unknown keys {unknown}: known are {sorted(DEFAULT_OPTIONS)}")
    attempts = options.get("ATTEMPTS", DEFAULT_OPTIONS["ATTEMPTS"])
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(f"OPTIONS['ATTEMPTS'] must be an integer >= 1, got {attempts!r}")
    wait = options.get("BACKOFF", DEFAULT_OPTIONS["BACKOFF"])
    if isinstance(wait, Backoff):
        return attempts, wait
    if isinstance(wait, bool) or not isinstance(wait, int | float | timedelta):
        raise ConfigurationError(f"OPTIONS['BACKOFF'] must be seconds, a timedelta or backoff(...), got {wait!r}")
    return attempts, backoff(wait)
