"""``DjangoTask``: the runs of Django's task backend (``pgbus_workflows.tasks``), as the admin lists them.

A proxy of ``WorkflowRun`` (no table of its own): a task is a one-step run of a class named
``django_task.<alias>``.
"""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

from .reading import ReadingQuerySet
from .runs import WorkflowRun

#: The start of every task class's name (``tasks.runs.task_workflow`` names them).
TASK_CLASS_PREFIX = "django_task."


class DjangoTaskQuerySet(ReadingQuerySet["DjangoTask"]):
    """The runs of the task classes this process knows (matched whole: the class's index serves it)."""

    def of_known_classes(self) -> DjangoTaskQuerySet:
        """The runs of the registered task classes (none when tasks are not configured)."""
        from ..dsl.declared import registry  # the registry is the declarations' (a layer below)

        names = [cls.name for cls in registry.classes() if cls.name.startswith(TASK_CLASS_PREFIX)]
        return self.filter(workflow_class__in=names)


class DjangoTask(WorkflowRun):
    """A task enqueued through ``pgbus_workflows.tasks.WorkflowsBackend``: its run, read as a task."""

    objects = DjangoTaskQuerySet.as_manager()  # type: ignore[assignment,misc]

    class Meta:
        proxy = True
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
