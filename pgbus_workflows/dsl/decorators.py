"""The decorators of a class body: ``@step``, ``@fan_out`` and ``removed_step()``, their options checked.

Each makes a :class:`~.definitions.StepDefinition` of the method it decorates, checking every
option when the class is defined (plain Python, no ORM).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any, overload

from ..exceptions import ConfigurationError
from .definitions import (
    DEFAULT_STEP_MAX_REATTEMPTS,
    EXCEPTION_ACTIONS,
    JOB_FAILURE_ACTIONS,
    MAX_NAME_LENGTH,
    MAX_QUEUE_LENGTH,
    TIMEOUT_ACTIONS,
    OnException,
    StepDefinition,
    check_wait,
    coerce_duration,
)


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
        backoff=check_wait(options.get("backoff"), "backoff"),
        on_job_failure=on_job_failure,
        wait=check_wait(options.get("wait"), "wait"),
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
        fairness=options.get("fairness"),
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
        "fairness",
    }
)


FAN_OUT_OPTIONS = frozenset(
    {"wait", "skip_if", "timeout", "on_exception", "max_reattempts", "queue", "priority", "renamed_from"}
    | {"max_attempts", "backoff", "on_job_failure", "concurrency", "rate_limit", "fairness"}
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
