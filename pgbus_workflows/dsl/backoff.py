"""``backoff()``: an exponential wait with full jitter, for reattempts and fan-out job retries (no ORM).

``OnException(..., action="reattempt", wait=backoff(base=timedelta(seconds=1), max=timedelta(minutes=5)))``:
attempt ``n`` waits ``min(max, base * factor ** (n - 1))``, or with ``jitter`` (the default)
a uniform random delay between 0 and that, so the workers that failed together against a
service do not all call it again in the same second (full jitter).
Wherever the DSL takes a wait callable, it asks it with the 1-based attempt number
(``resolve_wait``): the reattempts of an exception policy, a fan-out's job ``backoff=``.

The arguments are checked at the ``backoff(...)`` call, when the class is defined. Without
``max`` the wait stops growing at :data:`MAX_BACKOFF`, so a large attempt number neither
overflows a ``timedelta`` nor schedules an attempt past what a ``datetime`` holds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError

#: The longest wait a backoff gives (its cap without ``max``), and the longest ``base`` and
#: ``max`` it takes: as a schedule's longest interval, about ten years.
MAX_BACKOFF = timedelta(days=3660)


def _seconds(duration: timedelta) -> str:
    """``duration`` as a ``timedelta(seconds=...)`` expression, for a readable repr."""
    seconds = duration.total_seconds()
    return f"timedelta(seconds={int(seconds) if seconds.is_integer() else seconds})"


@dataclass(frozen=True)
class Backoff:
    """The wait spec :func:`backoff` returns: called with the 1-based attempt number, it gives that attempt's wait.

    Its fields are the checked arguments (``base`` and ``max`` as timedeltas); make one with
    :func:`backoff`, which refuses bad ones.
    """

    base: timedelta
    factor: int | float
    max: timedelta | None
    jitter: bool

    @property
    def cap(self) -> timedelta:
        """The longest wait: ``max``, else :data:`MAX_BACKOFF`."""
        return self.max or MAX_BACKOFF

    def ceiling(self, attempt: int) -> timedelta:
        """The wait of ``attempt`` without jitter: ``min(cap, base * factor ** (attempt - 1))``."""
        exponent = attempt - 1
        # Compared in logarithms first: a large attempt number would overflow the power itself.
        if self.factor > 1 and exponent * math.log(self.factor) >= math.log(self.cap / self.base):
            return self.cap
        return min(self.cap, self.base * self.factor**exponent)

    def __call__(self, attempt: int) -> timedelta:
        """The wait before ``attempt``: :meth:`ceiling`, or a uniform random delay from 0 to it with ``jitter``."""
        ceiling = self.ceiling(attempt)
        if not self.jitter:
            return ceiling
        return timedelta(seconds=random.uniform(0, ceiling.total_seconds()))  # noqa: S311 - spreads load, guards nothing

    def __repr__(self) -> str:
        limit = "None" if self.max is None else _seconds(self.max)
        return f"backoff(base={_seconds(self.base)}, factor={self.factor!r}, max={limit}, jitter={self.jitter!r})"


def _duration(value: Any, what: str) -> timedelta:
    """``value`` (seconds or a timedelta) as a timedelta of 1 microsecond to :data:`MAX_BACKOFF`."""
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ConfigurationError(f"backoff {what} must be a timedelta or a number of seconds, got {value!r}")
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    # NaN fails every comparison, so it is refused here with zero, the negatives and infinity.
    if not 0 < seconds < math.inf:
        raise ConfigurationError(f"backoff {what} must be a positive, finite duration, got {value!r}")
    if seconds > MAX_BACKOFF.total_seconds():
        raise ConfigurationError(f"backoff {what} must be at most {MAX_BACKOFF.days} days, got {value!r}")
    duration = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if not duration:
        raise ConfigurationError(f"backoff {what} must be at least 1 microsecond, got {value!r}")
    return duration


def backoff(
    base: timedelta | float,
    factor: float = 2,
    max: timedelta | float | None = None,  # noqa: A002 - the documented name
    jitter: bool = True,
) -> Backoff:
    """An exponential wait for ``OnException(wait=...)`` and ``@fan_out(backoff=...)``.

    Attempt ``n`` waits ``min(max, base * factor ** (n - 1))``; with ``jitter`` (full jitter)
    a uniform random delay between 0 and that instead. ``base`` and ``max`` are timedeltas or
    seconds, positive and at most :data:`MAX_BACKOFF` (the cap when ``max`` is None); ``max``
    must not be shorter than ``base``; ``factor`` is a finite number, at least 1. Anything
    else raises :class:`ConfigurationError` here, when the class is defined.
    """
    start = _duration(base, "base")
    # NaN fails every comparison; an int too large for a float still compares below infinity.
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 <= factor < math.inf:
        raise ConfigurationError(f"backoff factor must be a finite number of at least 1, got {factor!r}")
    limit = None if max is None else _duration(max, "max")
    if limit is not None and limit < start:
        raise ConfigurationError(f"backoff max must not be shorter than base, got max={max!r} and base={base!r}")
    if not isinstance(jitter, bool):
        raise ConfigurationError(f"backoff jitter must be True or False, got {jitter!r}")
    return Backoff(base=start, factor=factor, max=limit, jitter=jitter)
