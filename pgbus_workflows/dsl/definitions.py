"""The step DSL: ``@step``, ``removed_step()``, ``OnException`` (plain Python, no ORM).

Everything is validated when the class is defined, so a misconfigured workflow fails at
import time with a :class:`ConfigurationError` instead of at 3 a.m. in a dispatcher.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, overload

from django.utils.module_loading import import_string

from ..exceptions import ConfigurationError

EXCEPTION_ACTIONS = ("pause", "cancel", "reattempt", "skip")
TERMINAL_ACTIONS = ("pause", "cancel")
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


def _check_wait(value: Any, what: str) -> WaitSpec:
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
        if action not in EXCEPTION_ACTIONS:
            raise ConfigurationError(f"Unknown exception action {action!r}: use one of {', '.join(EXCEPTION_ACTIONS)}")
        if wait is not None and action != "reattempt":
            raise ConfigurationError(f"wait= only goes with action='reattempt', not {action!r}")
        if max_reattempts is not None:
            if action != "reattempt":
                raise ConfigurationError(f"max_reattempts= only goes with action='reattempt', not {action!r}")
            if isinstance(max_reattempts, bool) or not isinstance(max_reattempts, int) or max_reattempts < 1:
                raise ConfigurationError(f"max_reattempts must be a positive integer, got {max_reattempts!r}")
        if terminal_action not in TERMINAL_ACTIONS:
            raise ConfigurationError(f"terminal_action must be 'pause' or 'cancel', got {terminal_action!r}")
        if terminal_action != "pause" and action != "reattempt":
            raise ConfigurationError("terminal_action= only goes with action='reattempt'")
        self.exceptions = exceptions
        self.action = action
        self.wait = _check_wait(wait, "OnException wait")
        self.max_reattempts = max_reattempts
        self.terminal_action = terminal_action

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
    #: Fan-out only: attempts per job, the wait between them, and what a failed job does.
    max_attempts: int = 1
    backoff: WaitSpec = None
    on_job_failure: str = "fail"
    #: Earlier names of this step: runs scheduled or waiting on one continue on this step.
    renamed_from: tuple[str, ...] = ()
    #: ``Concurrency`` and ``RateLimit`` of this step (``dsl.limits``; checked with the class).
    concurrency: Any = None
    rate_limit: Any = None
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


def _check_wait_timeout(value: Any) -> timedelta | Callable[..., Any] | str | None:
    if value is None or callable(value):
        return value  # type: ignore[no-any-return]
    if isinstance(value, str):
        if not value:
            raise ConfigurationError("wait_timeout must be a duration, a callable or a method name, got ''")
        return value
    return coerce_duration(value, "wait_timeout")


def _check_skip_if(value: Any) -> Any:
    if value is None or isinstance(value, bool | str) or callable(value):
        return value
    raise ConfigurationError(f"skip_if must be a callable, a method name, a bool or None, got {value!r}")


def _step_policy(on_exception: Any, max_reattempts: Any, given_max: bool) -> OnException | None:
    if isinstance(on_exception, OnException):
        if given_max:
            raise ConfigurationError("max_reattempts= goes on the OnException policy, not on the step")
        return on_exception
    if on_exception is None:
        if given_max:
            raise ConfigurationError("max_reattempts= needs on_exception='reattempt'")
        return None
    if on_exception not in EXCEPTION_ACTIONS:
        raise ConfigurationError(
            f"Unknown on_exception {on_exception!r}: use one of {', '.join(EXCEPTION_ACTIONS)} or an OnException"
        )
    if on_exception != "reattempt":
        if given_max:
            raise ConfigurationError(f"max_reattempts= needs on_exception='reattempt', not {on_exception!r}")
        return OnException(action=on_exception)
    return OnException(action="reattempt", max_reattempts=max_reattempts if given_max else DEFAULT_STEP_MAX_REATTEMPTS)


_UNSET: Any = object()


def _check_renamed_from(value: Any) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else value
    if names is None:
        return ()
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ConfigurationError(f"renamed_from must be a step name or a list of step names, got {value!r}")
    if any(len(n) > MAX_NAME_LENGTH for n in names):
        raise ConfigurationError(f"renamed_from names must be at most {MAX_NAME_LENGTH} characters")
    return tuple(names)


def _build(func: Callable[..., Any], kind: str, options: dict[str, Any]) -> StepDefinition:
    if not callable(func):
        raise ConfigurationError(f"@{kind} decorates a method, got {func!r}")
    if inspect.isasyncgenfunction(func):
        raise ConfigurationError(f"{func.__qualname__} is an async generator: a step body returns, it does not yield")
    if inspect.iscoroutinefunction(func) and options.get("atomic"):
        raise ConfigurationError(
            f"{func.__qualname__} is an async def with atomic=True: Django's async ORM runs no transaction, so its "
            "writes could not commit with its outcome (make it a plain def, or drop atomic=True)"
        )
    given_max = options.get("max_reattempts", _UNSET) is not _UNSET
    policy = _step_policy(options.get("on_exception"), options.get("max_reattempts"), given_max)
    timeout = options.get("timeout")
    wait_timeout = options.get("wait_timeout")
    wait_for = options.get("wait_for")
    if wait_for is not None and not isinstance(wait_for, str | list | tuple):
        raise ConfigurationError(f"wait_for must be a signal name or a list of names, got {wait_for!r}")
    names = (wait_for,) if isinstance(wait_for, str) else tuple(wait_for or ())
    if any(not isinstance(n, str) or not n for n in names):
        raise ConfigurationError(f"wait_for must be a signal name or a list of names, got {wait_for!r}")
    if any(len(n) > MAX_NAME_LENGTH for n in names):
        raise ConfigurationError(f"wait_for names must be at most {MAX_NAME_LENGTH} characters (a signal's name is)")
    on_timeout = options.get("on_timeout") or "pause"
    if on_timeout not in TIMEOUT_ACTIONS:
        raise ConfigurationError(f"Unknown on_timeout {on_timeout!r}: use one of {', '.join(TIMEOUT_ACTIONS)}")
    if (wait_timeout is not None or options.get("on_timeout")) and not names:
        raise ConfigurationError("wait_timeout= and on_timeout= need wait_for=")
    priority = options.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ConfigurationError(f"priority must be an integer, got {priority!r}")
    queue = options.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise ConfigurationError(f"queue must be a non-empty string, got {queue!r}")
    if queue is not None and len(queue) > MAX_QUEUE_LENGTH:
        raise ConfigurationError(f"queue must be at most {MAX_QUEUE_LENGTH} characters, got {len(queue)}")
    max_attempts = options.get("max_attempts", 1)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be a positive integer, got {max_attempts!r}")
    on_job_failure = options.get("on_job_failure", "fail")
    if on_job_failure not in JOB_FAILURE_ACTIONS:
        raise ConfigurationError(f"on_job_failure must be 'fail' or 'continue', got {on_job_failure!r}")
    return StepDefinition(
        name=func.__name__,
        func=func,
        kind=kind,
        max_attempts=max_attempts,
        backoff=_check_wait(options.get("backoff"), "backoff"),
        on_job_failure=on_job_failure,
        wait=_check_wait(options.get("wait"), "wait"),
        skip_if=_check_skip_if(options.get("skip_if")),
        timeout=None if timeout is None else coerce_duration(timeout, "timeout"),
        on_exception=policy,
        atomic=bool(options.get("atomic", False)),
        queue=queue,
        priority=priority,
        wait_for=names,
        wait_timeout=_check_wait_timeout(wait_timeout),
        on_timeout=on_timeout,
        renamed_from=_check_renamed_from(options.get("renamed_from")),
        concurrency=options.get("concurrency"),
        rate_limit=options.get("rate_limit"),
        options=options,
    )


STEP_OPTIONS = frozenset(
    {
        "wait",
        "skip_if",
        "timeout",
        "on_exception",
        "max_reattempts",
        "wait_for",
        "wait_timeout",
        "on_timeout",
        "queue",
        "priority",
        "atomic",
        "renamed_from",
        "concurrency",
        "rate_limit",
    }
)


FAN_OUT_OPTIONS = frozenset(
    {"wait", "skip_if", "timeout", "on_exception", "max_reattempts", "queue", "priority", "renamed_from"}
    | {"max_attempts", "backoff", "on_job_failure", "concurrency", "rate_limit"}
)


#: What ``@step(...)`` and ``@fan_out(...)`` with options return: the decorator of a method.
Decorator = Callable[[Callable[..., Any]], "StepDefinition"]


@overload
def step(func: Callable[..., Any], /) -> StepDefinition: ...
@overload
def step(func: None = None, /, **options: Any) -> Decorator: ...
def step(func: Callable[..., Any] | None = None, /, **options: Any) -> StepDefinition | Decorator:
    """Declare a step: ``@step`` or ``@step(wait=..., skip_if=..., on_exception=...)``.

    Steps run in definition order. See the README for every option.
    """
    unknown = set(options) - STEP_OPTIONS
    if unknown:
        raise ConfigurationError(f"Unknown step option(s): {', '.join(sorted(unknown))}")
    if options.get("wait_for") is not None and options.get("atomic"):
        raise ConfigurationError("A wait_for step cannot be atomic=True")
    if func is not None:
        return _build(func, "step", options)
    return lambda f: _build(f, "step", options)


def removed_step() -> StepDefinition:
    """A gravestone for a step you deleted: runs still parked on it skip to the next step.

    ``old_reminder = removed_step()`` keeps the name taken, so a new step cannot reuse it
    while runs may still refer to it (``Cls.removed_steps_in_flight()`` counts them).
    """
    return StepDefinition(name="", func=None, kind="removed")


@overload
def fan_out(func: Callable[..., Any], /) -> StepDefinition: ...
@overload
def fan_out(func: None = None, /, **options: Any) -> Decorator: ...
def fan_out(func: Callable[..., Any] | None = None, /, **options: Any) -> StepDefinition | Decorator:
    """Declare a fan-out step: its body returns an iterable of :class:`Job`, run in parallel.

    ``@fan_out(max_attempts=3, backoff=timedelta(seconds=5), on_job_failure="fail")``. The
    step waits until the last job ends; then it completes with the counts, or (when a job
    failed and ``on_job_failure="fail"``) ``FanOutFailed`` goes to its exception policy.
    """
    unknown = set(options) - FAN_OUT_OPTIONS
    if unknown:
        raise ConfigurationError(f"Unknown fan_out option(s): {', '.join(sorted(unknown))}")
    if func is not None:
        return _build(func, "fan_out", options)
    return lambda f: _build(f, "fan_out", options)


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
