"""``@durable``: a function ``fn(ctx, **arguments)`` as a registered ``Workflow`` subclass.

A durable class has no fixed list of steps. Every checkpoint the function reaches is a step row
of its own, named by the checkpoint, and every name maps to one driver body that calls the
function from the top (``driver.drive``; ``async_context.drive`` for an ``async def``). The
run's first row, and the row that carries the function on after a checkpoint, is named
:data:`ENTRY` until the function reaches its next checkpoint, which renames it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from ..dsl.definitions import StepDefinition
from ..dsl.deploy import ANY_STEP
from ..exceptions import ConfigurationError, StepNotDefined
from ..workflow import Workflow
from . import async_context
from .driver import drive
from .names import ENTRY, RAISED

#: How many row names' definitions a durable class keeps made (``DurableWorkflow._definition``).
MADE_AT_MOST = 4096

#: The class attributes ``@durable`` passes on to the class it makes.
CLASS_ATTRIBUTES = (
    "allow_multiple",
    "exception_policies",
    "step_options",
    "debounce",
    "concurrency",
    "rate_limit",
    "schedules",
    "allow_missing_subject",
    "extra_signals",
)


class DurableWorkflow(Workflow):
    """The base of the classes ``@durable`` makes: any step name is a checkpoint of the function."""

    abstract = True
    #: ``OnException(action="raise")`` raises into the function (``dsl.validation`` refuses it elsewhere).
    _raises_into_function: ClassVar[bool] = True
    #: A fork copies a checkpoint that raised into the function as recorded (``services.forking``).
    copied_failure: ClassVar[Any] = RAISED
    #: The function: ``fn(ctx, **arguments)``; its return is the run's result.
    function: ClassVar[Callable[..., Any]]
    #: The body of every row: ``driver.drive``, or ``async_context.drive`` for an ``async def`` function.
    driver: ClassVar[Callable[[Any], Any]]
    #: The options each checkpoint name (without its ``#n``) was last called with, for the
    #: engine's look-ups made after the body (the exception policy of a failed checkpoint).
    _checkpoints: ClassVar[dict[str, StepDefinition]]
    #: The definitions :meth:`_definition` made, by row name (emptied when :meth:`remember` changes one).
    _made: ClassVar[dict[str, StepDefinition]]

    @classmethod
    def step_definitions(cls) -> tuple[StepDefinition, ...]:
        """The entry row's definition: the only step known before the function runs."""
        return (cls._definition(ENTRY),)

    @classmethod
    def step_definition(cls, name: str) -> StepDefinition | None:
        """Every name is the function's: a checkpoint's name, or :data:`ENTRY`."""
        return cls._definition(name)

    @classmethod
    def known_step_names(cls) -> frozenset[str]:
        """Any name (``ANY_STEP``): every checkpoint is the function's (see ``step_definition``)."""
        return frozenset({ENTRY, ANY_STEP})

    @classmethod
    def accepts_signal(cls, name: str) -> bool:
        """Any signal: a function decides as it runs which it waits for (one sent early is kept)."""
        return True

    @classmethod
    def next_step_after(cls, name: str | None) -> StepDefinition | None:
        """After any row, the function goes on from the top: :data:`ENTRY`."""
        return cls._definition(ENTRY)

    @classmethod
    def _definition(cls, name: str) -> StepDefinition:
        """The definition of row name ``name``: made once until its checkpoint is called with other options.

        Every row's claim, body and outcome ask for it several times.
        """
        made = cls._made.get(name)
        if made is None:
            if len(cls._made) >= MADE_AT_MOST:  # a loop's checkpoints (c#1, c#2...) are many names
                cls._made.clear()
            made = cls._made[name] = cls._make(name)
        return made

    @classmethod
    def _make(cls, name: str) -> StepDefinition:
        base = name.split("#", 1)[0]
        known = cls._checkpoints.get(base)
        # A wait's timeout wakes the function, which takes None (on_timeout="run"), and so does the
        # end of a fan-out's last member (on_job_failure="run"): in any process, the function decides.
        if known is None:
            return StepDefinition(name=name, func=cls.driver, on_timeout="run", on_job_failure="run")
        # Its attempts are routed, limited and timed as the checkpoint says; ``atomic`` is the
        # function's to apply (the driver commits the body's writes with its output), not the row's.
        return replace(known, name=name, func=cls.driver, on_timeout="run", on_job_failure="run", atomic=False)

    @classmethod
    def rewind_to(cls, run: Any, name: str) -> tuple[StepDefinition, list[str]]:
        """``resume_at(name)`` rewinds to checkpoint ``name``, one the run reached: it and every later one run again.

        Returns its definition and the checkpoints after it, superseded (their rows stay in the
        history). ``StepNotDefined`` for a name the run did not reach.
        """
        reached = cls._reached(run, name)
        return cls._definition(name), reached[reached.index(name) + 1 :]

    @classmethod
    def fork_point(cls, run: Any, from_step: str | None) -> tuple[StepDefinition, list[str]]:
        """A fork starts at checkpoint ``from_step``, one the run reached, keeping the checkpoints before it.

        None: at the top (:data:`ENTRY`), keeping nothing. The fork's function replays the kept
        checkpoints' outputs (and failures raised into it) and runs ``from_step`` and on.
        """
        if from_step is None:
            return cls._definition(ENTRY), []
        reached = cls._reached(run, from_step)
        return cls._definition(from_step), reached[: reached.index(from_step)]

    @classmethod
    def step_names_of(cls, run: Any) -> list[str]:
        """The checkpoints ``run`` reached, in order (superseded ones left out): what resume at and fork offer."""
        from .checkpoints import latest_attempts  # deferred: it imports the models

        return list(latest_attempts(run.pk))

    @classmethod
    def _reached(cls, run: Any, name: str) -> list[str]:
        """The checkpoints ``run`` reached, in order (superseded ones left out); ``StepNotDefined`` without ``name``."""
        reached = cls.step_names_of(run)
        if name not in reached:
            raise StepNotDefined(
                f"Checkpoint {name!r} was not reached by run {run.workflow_id} of {cls.name}. "
                f"Reached: {', '.join(reached) or 'none'}"
            )
        return reached

    @classmethod
    def remember(cls, definition: StepDefinition) -> None:
        """Keep the options a checkpoint was called with (``definition.name`` without its ``#n``)."""
        if cls._checkpoints.get(definition.name) is not definition:  # ``checkpoint_definition`` makes each once
            cls._checkpoints[definition.name] = definition
            cls._made.clear()


def durable(name: str | None = None, **attributes: Any) -> Callable[[Callable[..., Any]], type[DurableWorkflow]]:
    """Turn ``fn(ctx, **arguments)`` into a ``Workflow`` subclass registered under ``name``.

    ``attributes`` are the class attributes of any workflow (``allow_multiple``,
    ``exception_policies``, ``concurrency``...); ``name`` defaults to the function's dotted path.
    ``start(subject, **arguments)`` passes the arguments to ``fn`` by keyword. An ``async def
    fn`` awaits the same calls (``await ctx.step(...)``) on the dispatcher's event loop.
    """
    unknown = set(attributes) - set(CLASS_ATTRIBUTES)
    if unknown:
        raise ConfigurationError(
            f"@durable takes {', '.join(CLASS_ATTRIBUTES)} and name, not {', '.join(sorted(unknown))}"
        )

    def make(fn: Callable[..., Any]) -> type[DurableWorkflow]:
        if not callable(fn):
            raise ConfigurationError(f"@durable decorates a function, not {fn!r}")
        namespace: dict[str, Any] = {
            **attributes,
            "abstract": False,
            "function": staticmethod(fn),
            "driver": staticmethod(async_context.drive if inspect.iscoroutinefunction(fn) else drive),
            "_checkpoints": {},
            "_made": {},
            "__module__": fn.__module__,
            "__qualname__": fn.__qualname__,
            "__doc__": fn.__doc__,
        }
        if name is not None:
            namespace["name"] = name
        return type(fn.__name__, (DurableWorkflow,), namespace)

    return make
