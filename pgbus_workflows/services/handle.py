"""``RunHandle``: a declared workflow class bound to one run's row, the half of ``Workflow`` the engine drives.

The executor builds one per attempt (``handle_class(run)(run)``) to run the guards and the
body; ``start()`` returns one. ``Workflow`` adds the operator verbs, the family and the
step-only readers on top of it (``pgbus_workflows.workflow``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..conf import settings
from ..dsl.declared import DeclaredWorkflow, registry
from ..dsl.definitions import AttemptRoute
from ..exceptions import ConfigurationError, InvalidTransition
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
    def step_names_of(cls, run: WorkflowRun) -> list[str]:
        """The steps an operator picks from for ``run`` (resume at, fork from): the class's, in order.

        A durable function's are the checkpoints the run reached.
        """
        return [s.name for s in cls.step_definitions()]

    #: The output of a failed attempt that a fork copies as recorded (a durable function's raised
    #: checkpoint, ``functions``); None: a fork copies successful attempts only.
    copied_failure: ClassVar[Any] = None

    @classmethod
    def fork_point(cls, run: WorkflowRun, from_step: str | None) -> tuple[StepDefinition, list[str]]:
        """Where a fork of ``run`` starts (``from_step``, the first step when None), and the steps before it.

        ``StepNotDefined`` for a step the class has not; a durable function forks at a checkpoint
        the run reached. The fork copies the recorded outputs of the steps before it.
        """
        steps = cls.step_definitions()
        if not steps:
            raise InvalidTransition(f"Cannot fork {run.workflow_id}: {cls.name} has no steps")
        start = cls.require_step(from_step) if from_step is not None else steps[0]
        return start, [s.name for s in steps[: steps.index(start)]]

    @classmethod
    def rewind_to(cls, run: WorkflowRun, name: str) -> tuple[StepDefinition, list[str]]:
        """Where ``resume_at(name)`` resumes ``run``: the step's definition, and the steps it supersedes.

        A step class runs on from any of its steps (``require_step``) and supersedes nothing: its
        steps are read by name. A durable function rewinds to a checkpoint it reached.
        """
        return cls.require_step(name), []

    @classmethod
    def route_attempt(cls, definition: StepDefinition, run: WorkflowRun) -> AttemptRoute:
        """The queue and priority of each new attempt of the step ``definition`` in ``run``.

        By default the step's ``queue=`` and ``priority=``, else the class's ``step_options``,
        else ``DEFAULT_QUEUE`` and 0. Override it to route by the run (its ``arguments``, its
        ``workflow_class``), as the task backend routes each task by its ``queue_name`` and
        ``priority``; call ``super().route_attempt(definition, run)`` for the default. It runs
        while the run's row is locked, for every attempt scheduled (reattempts included): keep
        it to reading ``definition`` and ``run``, no query. A queue that is not a non-empty
        string or a priority that is not an integer raises ``ConfigurationError``.
        """
        queue = definition.queue or cls.step_options.get("queue") or settings.DEFAULT_QUEUE
        priority = definition.priority
        return AttemptRoute(queue, cls.step_options.get("priority", 0) if priority is None else priority)


def attempt_route(cls: type[RunHandle], definition: StepDefinition, run: WorkflowRun) -> AttemptRoute:
    """``cls.route_attempt``'s route, checked: ``ConfigurationError`` naming the class when it is not one."""
    route = cls.route_attempt(definition, run)
    if (
        not isinstance(route, tuple)
        or len(route) != 2
        or not isinstance(route[0], str)
        or not route[0]
        or not isinstance(route[1], int)
        or isinstance(route[1], bool)
    ):
        raise ConfigurationError(
            f"{cls.__module__}.{cls.__qualname__}.route_attempt returned {route!r} for step "
            f"{definition.name!r}: return AttemptRoute(queue, priority), a non-empty queue name and an int"
        )
    return AttemptRoute(*route)


def handle_class(name: str, gone: type[RunHandle] = RunHandle) -> type[RunHandle]:
    """The class registered as ``name`` (a run's ``workflow_class``), or ``gone`` when that class is gone.

    The engine handles a run of a gone class as a bare ``RunHandle``; ``workflow.handle_for``
    passes the bare ``Workflow``, so users get its verbs.
    """
    cls = registry.get(name) or gone
    if not issubclass(cls, RunHandle):
        raise ConfigurationError(
            f"{cls.__module__}.{cls.__qualname__} is registered as {name!r} "
            "but is not a Workflow subclass: subclass pgbus_workflows.Workflow"
        )
    return cls
