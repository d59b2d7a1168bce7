"""``RunHandle``: a declared workflow class bound to one run's row, the half of ``Workflow`` the engine drives.

The executor builds one per attempt (``handle_class(run)(run)``) to run the guards and the
body; ``start()`` returns one. ``Workflow`` adds the operator verbs, the family and the
step-only readers on top of it (``pgbus_workflows.workflow``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..conf import settings
from ..dsl.declared import DeclaredWorkflow, registry
from ..exceptions import ConfigurationError
from .payload import load_subject

if TYPE_CHECKING:
    # Annotations only: ``Workflow`` builds on this module, and the package imports it before the app registry is ready.
    from ..dsl.definitions import StepDefinition
    from ..models import WorkflowRun
    from .context import StepContext


class RunHandle(DeclaredWorkflow):
    """A workflow class's instance on one run: its row, its subject, and the body's context while a step runs."""

    abstract = True

    def __init__(self, record: WorkflowRun, *, duplicate_start: bool = False, debounced: bool = False) -> None:
        self.record = record
        #: True when ``start()`` found the run its ``idempotency_key`` already started.
        self.duplicate_start = duplicate_start
        #: True when ``start()`` collapsed into a run of its debounce key that had not begun (``Debounce``).
        self.debounced = debounced
        self._context: StepContext | None = None
        self._subject_cache: tuple[Any] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.record.workflow_id} {self.record.status}>"

    @property
    def workflow_id(self) -> Any:
        """The run's public id (a UUID)."""
        return self.record.workflow_id

    @property
    def subject(self) -> Any:
        """The model instance the run is about (None when it had none or it was deleted)."""
        if self._subject_cache is None:
            self._subject_cache = (load_subject(self.record.subject_type, self.record.subject_id),)
        return self._subject_cache[0]

    def cancel_if(self) -> bool:
        """Override to cancel the run before any step when it returns True."""
        return False

    @classmethod
    def _attempt_route(cls, definition: StepDefinition, run: WorkflowRun) -> tuple[str, int]:
        """``(queue, priority)`` of a new attempt of ``definition`` in ``run``: the step's, else the
        class's ``step_options``, else ``DEFAULT_QUEUE`` and 0. (A task routes by its run.)"""
        queue = definition.queue or cls.step_options.get("queue") or settings.DEFAULT_QUEUE
        priority = definition.priority
        return queue, cls.step_options.get("priority", 0) if priority is None else priority


def handle_class(name: str) -> type[RunHandle]:
    """The class registered as ``name`` (a run's ``workflow_class``), or the bare ``Workflow`` when it is gone."""
    cls = registry.class_for(name)
    if not issubclass(cls, RunHandle):
        raise ConfigurationError(
            f"{cls.__module__}.{cls.__qualname__} is registered as {name!r} "
            "but is not a Workflow subclass: subclass pgbus_workflows.Workflow"
        )
    return cls
