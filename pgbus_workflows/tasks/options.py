"""A backend alias's ``OPTIONS``, checked without the app's models (the backend's check runs without them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ..dsl.backoff import Backoff, backoff
from ..exceptions import ConfigurationError

#: ``OPTIONS`` keys and their defaults: one attempt (the API retries nothing), then 10 s, doubling.
DEFAULT_OPTIONS: dict[str, Any] = {"ATTEMPTS": 1, "BACKOFF": 10}


def checked_options(options: dict[str, Any]) -> tuple[int, Backoff]:
    """``(attempts, backoff)`` of a backend's ``OPTIONS``; ``ConfigurationError`` on anything else."""
    if not isinstance(options, dict):
        raise ConfigurationError(f"OPTIONS must be a dict, got {options!r}")
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ConfigurationError(f"OPTIONS has unknown keys {unknown}: known are {sorted(DEFAULT_OPTIONS)}")
    attempts = options.get("ATTEMPTS", DEFAULT_OPTIONS["ATTEMPTS"])
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(f"OPTIONS['ATTEMPTS'] must be an integer >= 1, got {attempts!r}")
    wait = options.get("BACKOFF", DEFAULT_OPTIONS["BACKOFF"])
    if isinstance(wait, Backoff):
        return attempts, wait
    if isinstance(wait, bool) or not isinstance(wait, int | float | timedelta):
        raise ConfigurationError(f"OPTIONS['BACKOFF'] must be seconds, a timedelta or backoff(...), got {wait!r}")
    return attempts, backoff(wait)
