"""What ``ctx.step`` takes beside a checkpoint's name and body: a step's options, checked as ``@step`` checks them.

``checkpoint_definition`` makes the checkpoint's :class:`StepDefinition` (the same checks and
meanings as ``@step``); ``"raise"`` is the one action only a checkpoint has: the failure is
recorded once the policy gives up and :class:`StepFailed` raised into the function.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from ..dsl.decorators import step as declare_step
from ..dsl.definitions import OnException, StepDefinition
from ..dsl.limits import Concurrency, RateLimit, check_limit_option
from ..exceptions import ConfigurationError

#: What ``ctx.step`` takes beside the name and the body (a step's options, DESIGN 18).
STEP_OPTIONS = ("on_exception", "max_reattempts", "timeout", "atomic", "concurrency", "rate_limit", "queue", "priority")

#: The actions ``on_exception=`` takes on a checkpoint as a string ("skip" would leave a hole in the replay).
CHECKPOINT_ACTIONS = ("pause", "cancel", "reattempt", "raise")


def checkpoint_definition(name: str, options: dict[str, Any]) -> StepDefinition:
    """The definition of checkpoint ``name`` called with ``options``; ``ConfigurationError`` for a bad one.

    ``on_exception`` is an ``OnException`` or one of :data:`CHECKPOINT_ACTIONS`;
    ``max_reattempts=n`` goes with ``"reattempt"`` (then the run pauses, as a step's) or with
    ``"raise"`` (then the failure is raised into the function). Made once for each name and
    options that can be hashed (every call of a checkpoint on every replay asks for it).
    """
    try:
        return _cached(name, tuple(sorted(options.items())))
    except TypeError:  # an option's value cannot be hashed (a callable key is hashable; a list is not)
        return _definition(name, options)


@lru_cache(maxsize=4096)
def _cached(name: str, items: tuple[tuple[str, Any], ...]) -> StepDefinition:
    return _definition(name, dict(items))


def _definition(name: str, options: dict[str, Any]) -> StepDefinition:
    unknown = set(options) - set(STEP_OPTIONS)
    if unknown:
        raise ConfigurationError(f"ctx.step takes {', '.join(STEP_OPTIONS)}, not {', '.join(sorted(unknown))}")
    given = dict(options)
    policy = given.get("on_exception")
    if isinstance(policy, str) and policy not in CHECKPOINT_ACTIONS:
        raise ConfigurationError(
            f"ctx.step(on_exception=) takes an OnException or one of {', '.join(CHECKPOINT_ACTIONS)}, got {policy!r}"
        )
    if policy is not None and not isinstance(policy, str | OnException):
        raise ConfigurationError(f"ctx.step(on_exception=) takes an OnException or an action, got {policy!r}")
    if isinstance(policy, OnException) and policy.action == "skip":
        raise ConfigurationError("A checkpoint cannot be skipped: its value is what the function goes on with")
    if policy == "raise":
        most = given.pop("max_reattempts", None)
        given["on_exception"] = (
            OnException(action="raise")
            if most is None
            else OnException(action="reattempt", max_reattempts=most, terminal_action="raise")
        )
    check_limit_option(given.get("concurrency"), Concurrency, f"ctx.step({name!r}) concurrency")
    check_limit_option(given.get("rate_limit"), RateLimit, f"ctx.step({name!r}) rate_limit")
    definition = declare_step(**given)(_checkpoint)
    return replace(definition, name=name, func=None)


def _checkpoint() -> None:
    """The stand-in body ``@step`` checks the options against (a checkpoint's body is ``ctx.step``'s ``fn``)."""
