"""Checks of a workflow class as it is defined: what would otherwise fail in a dispatcher.

Run by the metaclass once the class's steps are collected; everything raises
:class:`~pgbus_workflows.exceptions.ConfigurationError` naming the class and the option.
"""

from __future__ import annotations

import inspect

from ..exceptions import ConfigurationError
from .debounce import Debounce
from .definitions import MAX_QUEUE_LENGTH, OnException, StepDefinition
from .fairness import check_fairness_option
from .limits import Concurrency, RateLimit, check_limit_option
from .schedules import declared_schedules


def validate_class(cls: type) -> None:
    """Raise :class:`ConfigurationError` for a class attribute or step that cannot work."""
    policies = cls.__dict__.get("exception_policies", [])
    if not isinstance(policies, list | tuple) or not all(isinstance(p, OnException) for p in policies):
        raise ConfigurationError(f"{cls.__qualname__}.exception_policies must be a list of OnException")
    options = cls.__dict__.get("step_options", {})
    if not isinstance(options, dict) or set(options) - {"queue", "priority"}:
        raise ConfigurationError(f"{cls.__qualname__}.step_options takes only 'queue' and 'priority'")
    queue = options.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise ConfigurationError(f"{cls.__qualname__}.step_options['queue'] must be a non-empty string, got {queue!r}")
    if queue is not None and len(queue) > MAX_QUEUE_LENGTH:
        raise ConfigurationError(
            f"{cls.__qualname__}.step_options['queue'] must be at most {MAX_QUEUE_LENGTH} characters, got {len(queue)}"
        )
    priority = options.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ConfigurationError(f"{cls.__qualname__}.step_options['priority'] must be an integer, got {priority!r}")
    name = cls.__dict__.get("name")
    if name is not None and (not isinstance(name, str) or not name or len(name) > 255):
        raise ConfigurationError(f"{cls.__qualname__}.name must be a non-empty string of at most 255 characters")
    extra = cls.__dict__.get("extra_signals", ())
    if not isinstance(extra, list | tuple | set | frozenset) or not all(isinstance(n, str) and n for n in extra):
        raise ConfigurationError(f"{cls.__qualname__}.extra_signals must be a list of signal names")
    declared_schedules(cls)
    _validate_debounce(cls)
    _validate_limits(cls)
    _validate_names(cls)
    _validate_conditions(cls)
    _validate_raise(cls)


def _validate_raise(cls: type) -> None:
    """``action="raise"`` is a durable function's (it raises into the function); a step class has none to raise into."""
    if getattr(cls, "_raises_into_function", False):
        return
    steps: tuple[StepDefinition, ...] = cls._step_definitions  # type: ignore[attr-defined]
    named = [("exception_policies", p) for p in cls.__dict__.get("exception_policies", [])]
    named += [(f"{s.name} on_exception", s.on_exception) for s in steps if s.on_exception is not None]
    for where, policy in named:
        if policy.raises:
            raise ConfigurationError(
                f"{cls.__qualname__}.{where}: 'raise' raises into a durable function (@durable); a step has no "
                "code to raise into (use pause, cancel, reattempt or skip)"
            )


def _validate_debounce(cls: type) -> None:
    """``debounce`` is a ``Debounce`` with a key that names one run, and the first step has no wait of its own."""
    debounce = getattr(cls, "debounce", None)  # inherited: a subclass may turn on allow_multiple
    if debounce is None:
        return
    if not isinstance(debounce, Debounce):
        raise ConfigurationError(f"{cls.__qualname__}.debounce must be a Debounce, got {debounce!r}")
    if debounce.key is None and getattr(cls, "allow_multiple", False):
        raise ConfigurationError(
            f"{cls.__qualname__}.debounce needs a key: with allow_multiple=True the subject does not identify one run"
        )
    steps: tuple[StepDefinition, ...] = cls._step_definitions  # type: ignore[attr-defined]
    first = next((s for s in steps if not s.removed), None)
    if first is not None and first.wait is not None:
        raise ConfigurationError(
            f"{cls.__qualname__}.{first.name}: the first step of a debounced class takes no wait "
            "(it waits the debounce period)"
        )


def _validate_limits(cls: type) -> None:
    """``concurrency`` and ``rate_limit``, on the class and on each step, are a ``Concurrency`` and a ``RateLimit``."""
    check_limit_option(cls.__dict__.get("concurrency"), Concurrency, f"{cls.__qualname__}.concurrency")
    check_limit_option(cls.__dict__.get("rate_limit"), RateLimit, f"{cls.__qualname__}.rate_limit")
    check_fairness_option(cls.__dict__.get("fairness"), f"{cls.__qualname__}.fairness")
    steps: tuple[StepDefinition, ...] = cls._step_definitions  # type: ignore[attr-defined]
    for definition in steps:
        where = f"{cls.__qualname__}.{definition.name}"
        check_limit_option(definition.concurrency, Concurrency, f"{where}: concurrency=")
        check_limit_option(definition.rate_limit, RateLimit, f"{where}: rate_limit=")
        check_fairness_option(definition.fairness, f"{where}: fairness=")


def _validate_names(cls: type) -> None:
    """Every step name, gravestone and ``renamed_from`` name denotes one step."""
    steps: tuple[StepDefinition, ...] = cls._step_definitions  # type: ignore[attr-defined]
    owner: dict[str, str] = {s.name: s.name for s in steps}
    for definition in steps:
        for old in definition.renamed_from:
            if old in owner and owner[old] != definition.name:
                taken = "a gravestone" if old in {s.name for s in steps if s.removed} else f"step {owner[old]!r}"
                raise ConfigurationError(
                    f"{cls.__qualname__}.{definition.name}: renamed_from={old!r} is already {taken}"
                )
            owner[old] = definition.name


def _validate_conditions(cls: type) -> None:
    """Condition and deadline method names exist and are plain methods; none is an ``async def``."""
    steps: tuple[StepDefinition, ...] = cls._step_definitions  # type: ignore[attr-defined]
    for definition in steps:
        condition = definition.skip_if
        if isinstance(condition, str):
            method = getattr(cls, condition, None)
            if not callable(method):
                raise ConfigurationError(
                    f"{cls.__qualname__}.{definition.name}: skip_if={condition!r} names no method of the class"
                )
            condition = method
        if callable(condition) and inspect.iscoroutinefunction(condition):
            raise ConfigurationError(f"{cls.__qualname__}.{definition.name}: skip_if must not be an async def")
        deadline = definition.wait_timeout
        if isinstance(deadline, str):
            deadline = getattr(cls, deadline, None)
            if not callable(deadline):
                raise ConfigurationError(
                    f"{cls.__qualname__}.{definition.name}: wait_timeout={definition.wait_timeout!r} "
                    "names no method of the class"
                )
        if callable(deadline) and inspect.iscoroutinefunction(deadline):
            raise ConfigurationError(f"{cls.__qualname__}.{definition.name}: wait_timeout must not be an async def")
    if inspect.iscoroutinefunction(cls.__dict__.get("cancel_if")):
        raise ConfigurationError(f"{cls.__qualname__}.cancel_if must not be an async def")
