"""``Debounce``: starts of one key, close together, make one run (no ORM).

A workflow class declares ``debounce = Debounce(period=..., key=..., max_wait=...)``; the
collapsing itself happens at ``start()`` (``services.debounce``). Everything is validated when
the declaration is made, so a bad period fails at import time with a :class:`ConfigurationError`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeGuard

from ..exceptions import ConfigurationError
from .definitions import Duration, coerce_duration
from .text import unstorable

#: The longest debounce key a run stores (``varchar(255)``).
MAX_DEBOUNCE_KEY_LENGTH = 255

#: A debounce key: a fixed string, or a callable of the workflow handle (``subject``, ``arguments``).
KeySpec = str | Callable[[Any], Any] | None


class Debounce:
    """Collapse the starts of one key into one run until its first step begins.

    ``period``: how long the first step waits after the latest start (seconds or a
    ``timedelta``, positive). ``key``: what identifies the run starts collapse into: None (the
    run's subject), a string, or a callable of the workflow handle returning a string.
    ``max_wait``: the latest the first step may be due, counted from the run's creation
    (positive, at least ``period``; None: no bound).
    """

    __slots__ = ("key", "max_wait", "period")

    def __init__(self, period: Duration, key: KeySpec = None, max_wait: Duration | None = None) -> None:
        self.period: timedelta = _positive(period, "Debounce period")
        self.max_wait: timedelta | None = None if max_wait is None else _positive(max_wait, "Debounce max_wait")
        if self.max_wait is not None and self.max_wait < self.period:
            raise ConfigurationError(f"Debounce max_wait ({self.max_wait}) must be at least its period ({self.period})")
        if key is not None and not callable(key) and not valid_key(key):
            raise ConfigurationError(
                f"Debounce key must be None, a callable of the workflow, or a non-empty string of at most "
                f"{MAX_DEBOUNCE_KEY_LENGTH} characters without NUL or lone surrogates, got {key!r}"
            )
        self.key: KeySpec = key

    def __repr__(self) -> str:
        return f"Debounce(period={self.period!r}, key={self.key!r}, max_wait={self.max_wait!r})"


def _positive(value: Any, what: str) -> timedelta:
    duration = coerce_duration(value, what)
    if duration <= timedelta(0):
        raise ConfigurationError(f"{what} must be positive, got {value!r}")
    return duration


def valid_key(value: Any) -> TypeGuard[str]:
    """True for what a run may store as its debounce key (a text column can store it)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_DEBOUNCE_KEY_LENGTH and unstorable(value) is None
