"""A task's ``TaskResult``, read from its run and the run's attempts; the task from its stored path."""

from __future__ import annotations

import traceback
import uuid
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.utils.module_loading import import_string

from ..models import TASK_CLASS_PREFIX, WorkflowRun, WorkflowStep
from ..sql import clock
from ..states import RunStatus, StepStatus
from .api import Task, TaskContext, TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus


def task_of(arguments: dict[str, Any], alias: str) -> Task:
    """The enqueued ``Task``: the decorated function at its path, with what the enqueue used.

    A path that no longer names a task (the function was moved or renamed) raises ``ImportError``
    naming it: in an attempt, the attempt's error; in ``get_result``, to its caller.
    """
    path = arguments["task"]
    try:
        found = import_string(path)
    except ImportError as error:
        raise ImportError(f"task {path} can no longer be imported: {error}") from error
    if not isinstance(found, Task):
        raise ImportError(f"{path} is no longer a task (decorate it with @task)")
    run_after = arguments.get("run_after")
    return found.using(
        priority=arguments["priority"],
        queue_name=arguments["queue_name"],
        backend=alias,
        run_after=None if run_after is None else datetime.fromisoformat(run_after),
    )


def get_result(alias: str, result_id: str) -> TaskResult:
    """The ``TaskResult`` of the task ``result_id`` enqueued through ``alias``; ``TaskResultDoesNotExist`` else."""
    try:
        workflow_id = uuid.UUID(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(result_id) from None
    run = WorkflowRun.objects.filter(workflow_id=workflow_id, workflow_class=f"{TASK_CLASS_PREFIX}{alias}").first()
    if run is None:
        raise TaskResultDoesNotExist(result_id)
    return result_of(run, alias)


def result_of(run: WorkflowRun, alias: str, running: WorkflowStep | None = None) -> TaskResult:
    """The ``TaskResult`` of a task's run, from its attempts (``running``: the one under way, as the body sees it)."""
    if running is not None and running.attempt == 1:
        attempts = [running]
    else:
        attempts = list(WorkflowStep.objects.filter(run_id=run.pk).order_by("attempt"))
    if running is not None:
        attempts = [running if attempt.pk == running.pk else attempt for attempt in attempts]
    begun = [attempt for attempt in attempts if attempt.started_at is not None]
    result: TaskResult = TaskResult(
        task=task_of(run.arguments, alias),
        id=str(run.workflow_id),
        status=_status(run, attempts),
        enqueued_at=run.created_at,
        started_at=begun[0].started_at if begun else None,
        finished_at=run.finished_at if run.status in (RunStatus.FINISHED, RunStatus.CANCELLED) else None,
        last_attempted_at=begun[-1].started_at if begun else None,
        args=run.arguments["args"],
        kwargs=run.arguments["kwargs"],
        backend=alias,
        errors=[_error(attempt) for attempt in attempts if attempt.error_class],
        worker_ids=[attempt.claimed_by for attempt in begun],
    )
    succeeded = [attempt for attempt in attempts if attempt.outcome == "success"]
    if succeeded and run.status == RunStatus.FINISHED:
        object.__setattr__(result, "_return_value", succeeded[-1].output)
    return result


def _status(run: WorkflowRun, attempts: list[WorkflowStep]) -> TaskResultStatus:
    if run.status == RunStatus.FINISHED:
        return TaskResultStatus.SUCCESSFUL
    if run.status == RunStatus.CANCELLED:
        return TaskResultStatus.FAILED
    if attempts and attempts[-1].status == StepStatus.IN_PROGRESS:
        return TaskResultStatus.RUNNING
    return TaskResultStatus.READY


def _error(attempt: WorkflowStep) -> TaskError:
    path = attempt.error_class if "." in attempt.error_class else f"builtins.{attempt.error_class}"
    return TaskError(exception_class_path=path, traceback=attempt.traceback or attempt.error_message)


def running_result(run: WorkflowRun, attempt: WorkflowStep) -> TaskResult:
    """The result as the attempt under way sees it (RUNNING); its first attempt costs no query."""
    return result_of(run, run.arguments["backend"], running=attempt)


def context_of(result: TaskResult) -> TaskContext:
    """The context a task that takes one is called with."""
    return TaskContext(task_result=result)


def finished(result: TaskResult, value: Any = None, error: BaseException | None = None) -> TaskResult:
    """``result`` as the attempt that just ended leaves it (for ``task_finished``): FAILED with
    ``error`` last in its ``errors``, else SUCCESSFUL with ``value``."""
    if error is None:
        ended = replace(result, status=TaskResultStatus.SUCCESSFUL, finished_at=clock.now())
        object.__setattr__(ended, "_return_value", value)
        return ended
    klass = type(error)
    failure = TaskError(
        exception_class_path=f"{klass.__module__}.{klass.__qualname__}",
        traceback="".join(traceback.format_exception(klass, error, error.__traceback__)),
    )
    return replace(result, status=TaskResultStatus.FAILED, finished_at=clock.now(), errors=[*result.errors, failure])
