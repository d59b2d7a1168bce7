"""``OPTIONS["FAIRNESS"]``: a backend's tasks claimed in turn by a key read from each task's arguments.

    "OPTIONS": {"FAIRNESS": {"KEY": "account_id", "WEIGHT": "shop.tenants.weight_of"}}

``KEY`` names a parameter of the tasks (the key of a task called with ``account_id=42`` is
``"account_id:42"``, passed by keyword or by position), or is a function of ``(task, args,
kwargs)`` returning the key: a callable, or its dotted path (as ``CACHES``' ``KEY_FUNCTION``).
``WEIGHT``, optional, is a function of the key returning an integer from 1 to 1,000,000, or its
dotted path. A task called without that argument (or for which the function returns None)
takes its turn under its function's own key, ``"task:<module path>"``: a flood of tasks with
no tenant delays a tenant's no more than another tenant's flood would. No ORM: the backend's
check runs without the app's models.
"""

from __future__ import annotations

import inspect
import json
import keyword
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from ..exceptions import ConfigurationError

#: What a key function is called with: the ``Task``, its positional and its keyword arguments (as stored: JSON).
KeyFunction = Callable[[Any, list[Any], dict[str, Any]], Any]
#: What a weight function is called with: the key; it returns an integer from 1 to 1,000,000.
WeightFunction = Callable[[str], int]


@dataclass(frozen=True)
class TaskFairness:
    """``OPTIONS["FAIRNESS"]`` checked for its shape (:func:`checked_fairness`); :func:`resolved` imports its paths."""

    #: A parameter name, a key function, or a key function's dotted path.
    key: str | KeyFunction
    #: A weight function, its dotted path, or None (every key weighs 1).
    weight: str | WeightFunction | None = None


def checked_fairness(value: Any) -> TaskFairness | None:
    """The ``TaskFairness`` of ``OPTIONS["FAIRNESS"]`` (None: no fairness); ``ConfigurationError`` on a bad shape."""
    if value is None:
        return None
    where = "OPTIONS['FAIRNESS']"
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where} must be a dict with a 'KEY' (and a 'WEIGHT'), got {value!r}")
    unknown = sorted(set(value) - {"KEY", "WEIGHT"})
    if unknown:
        raise ConfigurationError(f"{where} has unknown keys {unknown}: known are ['KEY', 'WEIGHT']")
    if "KEY" not in value:
        raise ConfigurationError(
            f"{where} needs a 'KEY': a parameter of the tasks, or a function of (task, args, kwargs)"
        )
    key, weight = value["KEY"], value.get("WEIGHT")
    if not (callable(key) or _identifier(key) or _dotted(key)):
        raise ConfigurationError(
            f"{where}['KEY'] must name a parameter of the tasks ('account_id'), or be a function of "
            f"(task, args, kwargs) or its dotted path, got {key!r}"
        )
    if weight is not None and not (callable(weight) or _dotted(weight)):
        raise ConfigurationError(f"{where}['WEIGHT'] must be a function of the key or its dotted path, got {weight!r}")
    return TaskFairness(key, weight)


def resolved(fairness: TaskFairness) -> tuple[str | KeyFunction, WeightFunction | None]:
    """``(key, weight)`` with their dotted paths imported; ``ConfigurationError`` naming a path that fails."""
    key = fairness.key
    if isinstance(key, str) and _dotted(key):
        key = _imported(key, "KEY")
    weight = fairness.weight
    if isinstance(weight, str):
        weight = _imported(weight, "WEIGHT")
    return key, weight


def task_key(fairness: TaskFairness, task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The fairness key of ``task`` called with ``args`` and ``kwargs`` (``Fairness`` checks what it is)."""
    key, _ = resolved(fairness)
    if isinstance(key, str):
        value = _argument(task, args, kwargs, key)
        found = (
            None if value is None else f"{key}:{value if isinstance(value, str) else json.dumps(value, sort_keys=True)}"
        )
    else:
        found = key(task, args, kwargs)
    return f"task:{task.module_path}" if found is None else found


def task_weight(fairness: TaskFairness, key: str) -> int:
    """The weight of ``key``: the ``WEIGHT`` function's, else 1."""
    _, weight = resolved(fairness)
    return 1 if weight is None else weight(key)


def _argument(task: Any, args: list[Any], kwargs: dict[str, Any], name: str) -> Any:
    """The argument ``name`` of the call, by keyword or by position, or its default (None: not given)."""
    if name in kwargs:
        return kwargs[name]
    context = [None] if task.takes_context else []  # the context comes first, before the enqueued arguments
    try:
        bound = inspect.signature(task.func).bind_partial(*context, *args, **kwargs)
    except (TypeError, ValueError):  # arguments the function does not take: its attempt fails, not the enqueue
        return None
    bound.apply_defaults()
    return bound.arguments.get(name)


def _imported(path: str, option: str) -> Callable[..., Any]:
    try:
        found = import_string(path)
    except ImportError as error:
        raise ConfigurationError(f"OPTIONS['FAIRNESS']['{option}']: {path} does not import ({error})") from error
    if not callable(found):
        raise ConfigurationError(f"OPTIONS['FAIRNESS']['{option}']: {path} is not a function, got {found!r}")
    return found  # type: ignore[no-any-return]


def _identifier(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and not keyword.iskeyword(value)


def _dotted(value: Any) -> bool:
    return isinstance(value, str) and "." in value and all(_identifier(part) for part in value.split("."))
