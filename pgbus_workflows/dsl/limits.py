"""``Concurrency`` and ``RateLimit``: how many steps of a key may run at once, or start per period (no ORM).

A class declares ``concurrency = Concurrency(...)`` or ``rate_limit = RateLimit(...)`` (every
step of its runs), a step ``@step(concurrency=..., rate_limit=...)`` (that step). The key is
a string or a callable of the workflow handle, evaluated when a step is scheduled
(:func:`step_limits`); the limits are enforced by the claim (``sql.limiting``). Everything
is validated where it is written: a bad limit fails at import time, a bad key when the step
is scheduled, with the class and the step named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from .definitions import Duration, coerce_duration
from .text import unstorable

#: The longest key a limit takes (the limiter row's name adds its kind in front).
MAX_LIMIT_KEY_LENGTH = 255

#: A limit's key: a fixed string, or a callable of the workflow handle (``subject``, ``arguments``).
LimitKey = str | Callable[[Any], Any]

#: The kinds of limiter rows, the prefix of their names (``concurrency:account:42``).
CONCURRENCY, RATE = "concurrency", "rate"


def _check_key(key: Any, what: str) -> LimitKey:
    if callable(key) or valid_limit_key(key):
        return key  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"{what} key must be a callable of the workflow or a non-empty string of at most "
        f"{MAX_LIMIT_KEY_LENGTH} characters without NUL or lone surrogates, got {key!r}"
    )


def _check_limit(limit: Any, what: str) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"{what} limit must be an integer of at least 1, got {limit!r}")
    if limit > 2**31 - 1:
        raise ConfigurationError(f"{what} limit must be at most {2**31 - 1}, got {limit!r}")
    return limit


def valid_limit_key(value: Any) -> bool:
    """True for what a limit may take as its key (a text column can store it)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_LIMIT_KEY_LENGTH and unstorable(value) is None


class Concurrency:
    """At most ``limit`` steps of the runs that share ``key`` in progress at once, across every dispatcher.

    ``key``: a string, or a callable of the workflow handle returning one (evaluated when a
    step is scheduled). ``limit``: at least 1. On a class it bounds every step of its runs; on
    a step, that step. A step waiting (a wait, a signal, a fan-out's jobs) holds no slot.
    """

    __slots__ = ("key", "limit")

    def __init__(self, key: LimitKey, limit: int = 1) -> None:
        self.key: LimitKey = _check_key(key, "Concurrency")
        self.limit: int = _check_limit(limit, "Concurrency")

    def __repr__(self) -> str:
        return f"Concurrency(key={self.key!r}, limit={self.limit})"


class RateLimit:
    """At most ``limit`` steps of ``key`` started per ``per``, shared by every dispatcher (a token bucket).

    The bucket holds up to ``limit`` tokens and refills at ``limit`` per ``per``; each claim
    spends one, so a burst of ``limit`` starts at once and then one every ``per / limit``.
    ``key`` as for :class:`Concurrency`; ``per`` positive (seconds or a ``timedelta``).
    """

    __slots__ = ("key", "limit", "per")

    def __init__(self, key: LimitKey, limit: int, per: Duration) -> None:
        self.key: LimitKey = _check_key(key, "RateLimit")
        self.limit: int = _check_limit(limit, "RateLimit")
        per = coerce_duration(per, "RateLimit per")
        if per <= timedelta(0):
            raise ConfigurationError(f"RateLimit per must be positive, got {per!r}")
        self.per: timedelta = per

    def __repr__(self) -> str:
        return f"RateLimit(key={self.key!r}, limit={self.limit}, per={self.per!r})"


Limit = Concurrency | RateLimit


@dataclass(frozen=True)
class BoundLimit:
    """One limit as a scheduled step holds it: the limiter row's name and what it allows."""

    #: ``concurrency:<key>`` or ``rate:<key>``: the limiter row's primary key.
    name: str
    kind: str
    limit: int
    #: A rate limit's period (None for a concurrency limit).
    per: timedelta | None


def check_limit_option(value: Any, kind: type[Limit], where: str) -> Limit | None:
    """``value`` when it is None or an instance of ``kind``; ``ConfigurationError`` naming ``where`` else."""
    if value is None or isinstance(value, kind):
        return value
    raise ConfigurationError(f"{where} must be a {kind.__name__}, got {value!r}")


def declared_limits(cls: Any, definition: Any) -> tuple[Limit, ...]:
    """The limits a step of ``cls`` is under: the class's, then the step's own."""
    found: list[Limit] = []
    for holder in (cls, definition):
        for attribute in ("concurrency", "rate_limit"):
            limit = getattr(holder, attribute, None)
            if limit is not None:
                found.append(limit)
    return tuple(found)


def step_limits(cls: Any, definition: Any, handle: Callable[[], Any]) -> tuple[BoundLimit, ...]:
    """The limits of a step about to be scheduled, their keys evaluated (``handle()`` gives the workflow).

    ``ValueError`` naming the class and the step when a key callable raises or returns
    something that is not a non-empty string of at most 255 characters, or one with a NUL
    character or a lone surrogate: nothing is written.
    """
    bound: dict[str, BoundLimit] = {}
    instance: Any = None
    for limit in declared_limits(cls, definition):
        key: Any = limit.key
        if callable(key):
            if instance is None:
                instance = handle()
            try:
                key = key(instance)
            except Exception as error:
                raise ValueError(
                    f"{cls.name}.{definition.name}: the {type(limit).__name__} key callable raised "
                    f"{type(error).__name__}: {error}"
                ) from error
            if not valid_limit_key(key):
                raise ValueError(
                    f"{cls.name}.{definition.name}: the {type(limit).__name__} key must be a non-empty string of "
                    f"at most {MAX_LIMIT_KEY_LENGTH} characters that PostgreSQL can store, got {key!r}"
                    + (f" ({reason})" if (reason := unstorable(key)) else "")
                )
        if isinstance(limit, Concurrency):
            found = BoundLimit(f"{CONCURRENCY}:{key}", CONCURRENCY, limit.limit, None)
        else:
            found = BoundLimit(f"{RATE}:{key}", RATE, limit.limit, limit.per)
        earlier = bound.get(found.name)
        if earlier is None or found.limit < earlier.limit:  # a key the class and the step share: the stricter
            bound[found.name] = found
    return tuple(bound.values())


def limit_label(name: str) -> tuple[str, str]:
    """``(kind, key)`` of a limiter row's name."""
    kind, _, key = name.partition(":")
    return kind, key
