"""A backend alias's ``OPTIONS``, checked without the app's models (the backend's check runs without them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

from ..dsl.backoff import Backoff, backoff
from ..exceptions import ConfigurationError
from .fairness import TaskFairness, checked_fairness

#: ``OPTIONS`` keys and their defaults: one attempt (the API retries nothing), then 10 s, doubling; no fairness.
DEFAULT_OPTIONS: dict[str, Any] = {"ATTEMPTS": 1, "BACKOFF": 10, "FAIRNESS": None}


class TaskOptions(NamedTuple):
    """A backend alias's ``OPTIONS``, checked: what its task class is made of."""

    #: How many times a failing task runs.
    attempts: int
    #: The wait before each attempt after the first.
    backoff: Backoff
    #: Claims take the tasks of several keys in turn (None: in priority and due order).
    fairness: TaskFairness | None


def checked_options(options: dict[str, Any]) -> TaskOptions:
    """The ``TaskOptions`` of a backend's ``OPTIONS``; ``ConfigurationError`` on anything else.

    ``FAIRNESS`` is checked for its shape only: its dotted paths are imported by the backend's
    check and its first ``enqueue`` (:func:`.fairness.resolved`), as the backend is made when a
    module declaring a task is imported, which may be the module those paths name.
    """
    if not isinstance(options, dict):
        raise ConfigurationError(f"OPTIONS must be a dict, got {options!r}")
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ConfigurationError(f"OPTIONS has unknown keys {unknown}: known are {sorted(DEFAULT_OPTIONS)}")
    attempts = options.get("ATTEMPTS", DEFAULT_OPTIONS["ATTEMPTS"])
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(f"OPTIONS['ATTEMPTS'] must be an integer >= 1, got {attempts!r}")
    fairness = checked_fairness(options.get("FAIRNESS"))
    wait = options.get("BACKOFF", DEFAULT_OPTIONS["BACKOFF"])
    if isinstance(wait, Backoff):
        return TaskOptions(attempts, wait, fairness)
    if isinstance(wait, bool) or not isinstance(wait, int | float | timedelta):
        raise ConfigurationError(f"OPTIONS['BACKOFF'] must be seconds, a timedelta or backoff(...), got {wait!r}")
    return TaskOptions(attempts, backoff(wait), fairness)
