"""The backends the upstream task tests name (Django's and the backport's), made of ``WorkflowsBackend``.

Django's tests use its two stand-in backends: ``DummyBackend`` stores a task and runs nothing,
``ImmediateBackend`` runs it inside ``enqueue``. Here both are ``WorkflowsBackend``, storing in
PostgreSQL: the first leaves the task for a dispatcher (none runs in those tests), the second
runs the task's attempt at once through the executor the dispatchers use. What the tests read
of the stand-ins beyond the task API (``results``, ``clear()``) is kept.
"""

from __future__ import annotations

from typing import Any

from pgbus_workflows.models import TASK_CLASS_PREFIX, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_step
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.states import StepStatus
from pgbus_workflows.tasks import WorkflowsBackend
from pgbus_workflows.tasks.api import Task, TaskResult


class DummyBackend(WorkflowsBackend):
    """``WorkflowsBackend`` as it is, with the ``results`` it enqueued and ``clear()`` (which deletes them)."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.results: list[TaskResult] = []

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Store the task; its result is also kept in ``results``."""
        result = super().enqueue(task, args, kwargs)
        self.results.append(result)
        return result

    def clear(self) -> None:
        """Forget every task of this alias: ``results`` and the stored runs."""
        self.results.clear()
        WorkflowRun.objects.filter(workflow_class=f"{TASK_CLASS_PREFIX}{self.alias}").delete()


class ImmediateBackend(WorkflowsBackend):
    """``WorkflowsBackend`` whose ``enqueue`` runs the task's attempt before it returns the task's result."""

    worker_id = "immediate"

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Store the task, claim its attempt and run it as a dispatcher would; the result as stored after."""
        result = super().enqueue(task, args, kwargs)
        step = WorkflowStep.objects.get(run__workflow_id=result.id, status=StepStatus.SCHEDULED)
        claimed = claim_step(step.pk, claimed_by=self.worker_id)
        assert claimed is not None, f"the attempt of task {result.id} could not be claimed"
        execute_step(claimed)
        return self.get_result(result.id)
