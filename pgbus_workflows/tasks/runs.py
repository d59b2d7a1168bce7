"""An enqueued task is a run: one step that calls the task's function, claimed like any step.

Each backend alias has a workflow class of its own, ``django_task.<alias>`` (built by
:func:`task_workflow` from the alias's ``OPTIONS``: how many attempts, how long between them),
so a task gets everything a step has: the SKIP LOCKED claim, heartbeats, stall recovery, the
SIGTERM grace, retention, the admin and the CLI. The run's arguments hold the task's path and
arguments, its queue and priority (each attempt is routed by them) and the backend's alias.
With ``OPTIONS["FAIRNESS"]`` the class has a ``Fairness`` whose key is read from the task's
arguments (:mod:`.fairness`), so its tasks are claimed in turn by key, as a class's steps are.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..dsl.decorators import step
from ..dsl.definitions import AttemptRoute, OnException, StepDefinition
from ..dsl.fairness import Fairness
from ..models import TASK_CLASS_PREFIX, WorkflowRun
from ..workflow import Workflow
from .fairness import TaskFairness, task_key, task_weight
from .options import checked_options
from .results import context_of, finished, running_result, task_of


class TaskRun(Workflow):
    """The run of one enqueued task (subclassed per backend alias by :func:`task_workflow`)."""

    abstract = True
    allow_multiple = True
    #: The backend alias whose tasks this class runs.
    alias = ""

    @classmethod
    def route_attempt(cls, definition: StepDefinition, run: WorkflowRun) -> AttemptRoute:
        """A task's attempts go to its ``queue_name``, before lower ``priority`` (ours: lower first)."""
        return AttemptRoute(run.arguments["queue_name"], -int(run.arguments["priority"]))

    @step
    def call(self) -> Any:
        """Call the task's function (with its context first when it takes one); its value is the output.

        Sends the API's ``task_started`` before and ``task_finished`` after the function (for
        an ``async def`` one, once it was awaited), from the backend's class, with the
        ``TaskResult`` as Django's ``ImmediateBackend`` sends them: the return value, or the
        error that failed the attempt last in ``errors``.
        """
        from .api import task_started

        step = self._step_context("a task").step
        task = task_of(self.arguments, self.alias)
        sender = type(task.get_backend())
        result = running_result(self.record, step)
        task_started.send(sender, task_result=result)
        arguments = list(self.arguments["args"])
        if task.takes_context:
            arguments.insert(0, context_of(result))
        try:
            value = task.func(*arguments, **self.arguments["kwargs"])
            if inspect.isawaitable(value):
                return _awaited(value, result, sender)
            value = normalize_json(value)
        except BaseException as error:
            _send_finished(sender, result, error=error)
            raise
        _send_finished(sender, result, value=value)
        return value


async def _awaited(coroutine: Any, result: Any, sender: type) -> Any:
    try:
        value = normalize_json(await coroutine)
    except BaseException as error:
        _send_finished(sender, result, error=error)
        raise
    _send_finished(sender, result, value=value)
    return value


def _send_finished(sender: type, result: Any, value: Any = None, error: BaseException | None = None) -> None:
    """``task_finished`` of the attempt that just ended (sent inside the ``except`` of a failure, for its logging)."""
    from .api import task_finished

    task_finished.send(sender, task_result=finished(result, value=value, error=error))


def normalize_json(value: Any) -> Any:
    """The API's own JSON check of a return value (a set, an object: ``TypeError``)."""
    from .api import normalize_json as normalized

    return normalized(value)


_classes: dict[str, type[TaskRun]] = {}


def task_workflow(alias: str, options: dict[str, Any] | None = None) -> type[TaskRun]:
    """The workflow class of ``alias``'s tasks, made (and registered) on first use or when its options change.

    Bad ``OPTIONS`` raise ``ConfigurationError`` (the backend's ``check()`` reports them).
    """
    checked = checked_options(options or {})
    attempts, wait, fairness = checked
    known = _classes.get(alias)
    if known is not None and known.options == checked:  # type: ignore[attr-defined]
        return known
    policies = [OnException(action="cancel")]
    if attempts > 1:
        policies = [OnException(action="reattempt", max_reattempts=attempts - 1, wait=wait, terminal_action="cancel")]
    namespace = {
        "__module__": __name__,
        "__qualname__": f"TaskRun[{alias}]",
        "name": f"{TASK_CLASS_PREFIX}{alias}",
        "alias": alias,
        "options": checked,
        "exception_policies": policies,
        "fairness": None if fairness is None else _fairness(fairness, alias),
    }
    cls: type[TaskRun] = type(f"TaskRun[{alias}]", (TaskRun,), namespace)
    _classes[alias] = cls
    return cls


def _fairness(fairness: TaskFairness, alias: str) -> Fairness:
    """The ``Fairness`` of ``alias``'s task class: its key read from each task's arguments, its weight ``WEIGHT``'s."""

    def key(wf: Workflow) -> Any:
        arguments = wf.arguments
        return task_key(fairness, task_of(arguments, alias), arguments["args"], arguments["kwargs"])

    return Fairness(key=key, weight=None if fairness.weight is None else lambda found: task_weight(fairness, found))
