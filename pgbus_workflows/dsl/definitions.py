"""What a step is: ``StepDefinition``, ``OnException`` and the durations they take (plain Python, no ORM).

The decorators that make definitions from a class body's methods are :mod:`.decorators`.
Everything is validated when the class is defined, so a misconfigured workflow fails at
import time with a :class:`ConfigurationError` instead of at 3 a.m. in a dispatcher.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, NamedTuple, overload

from django.utils.module_loading import import_string

from ..exceptions import ConfigurationError

EXCEPTION_ACTIONS = ("pause", "cancel", "reattempt", "skip")
TERMINAL_ACTIONS = ("pause", "cancel")
#: The action only a durable function's checkpoint takes: its failure is raised into the function.
RAISE = "raise"
TIMEOUT_ACTIONS = ("pause", "cancel", "skip", "run")
JOB_FAILURE_ACTIONS = ("fail", "continue")
#: ``max_reattempts`` when a step says ``on_exception="reattempt"`` without one (as pgbus).
DEFAULT_STEP_MAX_REATTEMPTS = 100

Duration = timedelta | int | float
WaitSpec = Duration | Callable[[int], Duration] | None

#: The longest queue name the steps table stores (``varchar(255)``).
MAX_QUEUE_LENGTH = 255
#: The longest step name, signal name and job path the tables store (``varchar(255)``).
MAX_NAME_LENGTH = 255


def coerce_duration(value: Any, what: str) -> timedelta:
    """A non-negative ``timedelta`` from seconds or a timedelta; ConfigurationError else (NaN, inf, too big too)."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ConfigurationError(f"{what} must be a timedelta or a number of seconds, got {value!r}")
    try:
        duration = value if isinstance(value, timedelta) else timedelta(seconds=value)
    except (ValueError, OverflowError):  # NaN; infinity or over 999,999,999 days
        raise ConfigurationError(
            f"{what} must be a finite number of seconds a timedelta holds, got {value!r}"
        ) from None
    if duration < timedelta(0):
        raise ConfigurationError(f"{what} must not be negative, got {value!r}")
    return duration


def check_wait(value: Any, what: str) -> WaitSpec:
    """A ``wait=``-like option as given, once checked: None, a callable of the attempt, or a duration."""
    if value is None or callable(value):
        return value  # type: ignore[no-any-return]
    return coerce_duration(value, what)


def resolve_wait(wait: WaitSpec, attempt: int) -> timedelta:
    """The delay a wait spec gives for ``attempt`` (1-based); a callable is asked each time."""
    if wait is None:
        return timedelta(0)
    if callable(wait):
        return coerce_duration(wait(attempt), "a wait callable's result")
    return coerce_duration(wait, "wait")


class OnException:
    """An exception policy: what to do when a step raises one of ``exceptions``.

    ``OnException(ConnectionError, action="reattempt", wait=timedelta(seconds=15),
    max_reattempts=5)``. With no exception classes the policy is a blanket one: it matches
    every exception, after the specific policies. Exception classes may be given as dotted
    strings, resolved when an error is matched (a missing class matches nothing).
    """

    def __init__(
        self,
        *exceptions: type[BaseException] | str,
        action: str = "pause",
        wait: WaitSpec = None,
        max_reattempts: int | None = None,
        terminal_action: str = "pause",
    ) -> None:
        for exc in exceptions:
            if isinstance(exc, str):
                continue
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise ConfigurationError(f"OnException takes exception classes or dotted names, got {exc!r}")
        if action not in (*EXCEPTION_ACTIONS, RAISE):
            raise ConfigurationError(
                f"Unknown exception action {action!r}: use one of {', '.join(EXCEPTION_ACTIONS)} "
                "(or 'raise' in a durable function)"
            )
        if wait is not None and action != "reattempt":
            raise ConfigurationError(f"wait= only goes with action='reattempt', not {action!r}")
        if max_reattempts is not None:
            if action != "reattempt":
                raise ConfigurationError(f"max_reattempts= only goes with action='reattempt', not {action!r}")
            if isinstance(max_reattempts, bool) or not isinstance(max_reattempts, int) or max_reattempts < 1:
                raise ConfigurationError(f"max_reattempts must be a positive integer, got {max_reattempts!r}")
        if terminal_action not in (*TERMINAL_ACTIONS, RAISE):
            raise ConfigurationError(
                "terminal_action must be 'pause' or 'cancel' (or 'raise' in a durable function), "
                f"got {terminal_action!r}"
            )
        if terminal_action != "pause" and action != "reattempt":
            raise ConfigurationError("terminal_action= only goes with action='reattempt'")
        self.exceptions = exceptions
        self.action = action
        self.wait = check_wait(wait, "OnException wait")
        self.max_reattempts = max_reattempts
        self.terminal_action = terminal_action

    @property
    def raises(self) -> bool:
        """True when the policy ends in ``raise``: only a durable function's checkpoint takes it."""
        return RAISE in (self.action, self.terminal_action)

    @property
    def is_blanket(self) -> bool:
        """True when the policy names no exception class (it matches everything)."""
        return not self.exceptions

    def matches(self, error: BaseException) -> bool:
        """True when ``error`` is an instance of one of the policy's exception classes."""
        if self.is_blanket:
            return True
        for exc in self.exceptions:
            if isinstance(exc, str):
                try:
                    exc = import_string(exc)
                except ImportError:
                    continue
            if isinstance(exc, type) and isinstance(error, exc):
                return True
        return False

    def __repr__(self) -> str:
        names = ", ".join(e if isinstance(e, str) else e.__name__ for e in self.exceptions)
        return f"OnException({names}{', ' if names else ''}action={self.action!r})"


class AttemptRoute(NamedTuple):
    """Where a new attempt of a step goes: the queue whose dispatchers run it, and its priority (lower first).

    What :meth:`Workflow.route_attempt <pgbus_workflows.Workflow.route_attempt>` returns.
    """

    #: The queue name (``run_workflow_dispatcher --queue``).
    queue: str
    #: The claim order among due attempts: lower first.
    priority: int


@dataclass(frozen=True)
class StepDefinition:
    """One declared step: its body and options. ``kind`` is "step", "fan_out" or "removed"."""

    name: str
    func: Callable[..., Any] | None
    kind: str = "step"
    wait: WaitSpec = None
    skip_if: Any = None
    timeout: timedelta | None = None
    on_exception: OnException | None = None
    atomic: bool = False
    queue: str | None = None
    priority: int | None = None
    wait_for: tuple[str, ...] = ()
    #: A duration, or (a deadline per run) a callable of the workflow or the name of one of its methods.
    wait_timeout: timedelta | Callable[..., Any] | str | None = None
    on_timeout: str = "pause"
    #: Fan-out only: attempts per job, the wait between them, and what a failed job does ("fail",
    #: "continue"; "run": the step is woken to run again and read its members' ends, a durable function's).
    max_attempts: int = 1
    backoff: WaitSpec = None
    on_job_failure: str = "fail"
    #: Earlier names of this step: runs scheduled or waiting on one continue on this step.
    renamed_from: tuple[str, ...] = ()
    #: ``Concurrency`` and ``RateLimit`` of this step (``dsl.limits``; checked with the class).
    concurrency: Any = None
    rate_limit: Any = None
    #: ``Fairness`` of this step, in place of its class's (``dsl.fairness``; checked with the class).
    fairness: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def removed(self) -> bool:
        """True for a ``removed_step()`` gravestone."""
        return self.kind == "removed"

    def __set_name__(self, owner: type, name: str) -> None:
        if self.name != name:
            # Attribute name is the step name; the class body assigned it under another.
            object.__setattr__(self, "name", name)

    @overload
    def __get__(self, instance: None, owner: type) -> StepDefinition: ...
    @overload
    def __get__(self, instance: object, owner: type) -> Callable[..., Any]: ...
    def __get__(self, instance: object | None, owner: type) -> Any:
        if instance is None or self.func is None:
            return self
        return self.func.__get__(instance, owner)


def ordered_steps(parent: Iterable[StepDefinition], own: Iterable[StepDefinition]) -> tuple[StepDefinition, ...]:
    """The parent's steps with the subclass's own: a redefinition keeps its place."""
    steps = list(parent)
    for definition in own:
        index = next((i for i, s in enumerate(steps) if s.name == definition.name), None)
        if index is None:
            steps.append(definition)
        else:
            steps[index] = definition
    return tuple(steps)


def with_name(definition: StepDefinition, name: str) -> StepDefinition:
    """A copy of ``definition`` under ``name`` (gravestones learn theirs from the class body)."""
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(f"A step name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}: {name}")
    return replace(definition, name=name)


def class_policies(cls: type) -> list[OnException]:
    """The class's ``exception_policies``, newest first: the subclass's own, last first, then the parents'."""
    policies: list[OnException] = []
    for klass in cls.__mro__:
        own = klass.__dict__.get("exception_policies")
        if own:
            policies.extend(reversed(list(own)))
    return policies


def resolve_policy(cls: type, definition: StepDefinition | None, error: BaseException) -> OnException:
    """The policy that applies to ``error``: the step's own, then specific, then blanket, else pause."""
    if definition is not None and definition.on_exception is not None:
        return definition.on_exception
    policies = class_policies(cls)
    for policy in policies:
        if not policy.is_blanket and policy.matches(error):
            return policy
    for policy in policies:
        if policy.is_blanket:
            return policy
    return OnException(action="pause")
