"""``Schedule``: a cron expression or an interval that starts a workflow on a clock (no ORM).

Everything is validated when the schedule is declared, so a bad expression or time zone fails
at import time with a :class:`ConfigurationError`. The tick arithmetic lives here too: the
services and the admin ask :func:`next_tick`, :func:`latest_tick` and :func:`describe`.

Cron expressions are parsed and iterated by ``cronsim`` (see ``pyproject.toml`` for why):
in the schedule's time zone, a time that a spring-forward change skips fires once, right
after the change, and a time that a fall-back change repeats fires once, the first time.
Intervals (``every=``) count from the Unix epoch in UTC, so every 15 minutes means :00,
:15, :30 and :45 on every host, whoever fired the last tick.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.core.serializers.json import DjangoJSONEncoder

from ..exceptions import ConfigurationError
from .definitions import MAX_NAME_LENGTH, coerce_duration

OVERLAP_POLICIES = ("skip", "allow", "cancel_previous")
CATCHUP_POLICIES = ("latest", "all", "none")
#: The shortest interval: the leader fires within about a second, so a shorter one cannot be kept.
MIN_EVERY = timedelta(seconds=1)
#: The longest interval (and jitter): longer ones would put ticks past what a datetime holds.
MAX_EVERY = timedelta(days=3660)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The longest time zone name the table stores.
MAX_TIMEZONE_LENGTH = 64


def check_cron(expression: Any) -> str:
    """``expression`` if it is a valid 5-field cron expression; else :class:`ConfigurationError`."""
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"cron must be a 5-field cron expression, got {expression!r}")
    fields = expression.split()
    if len(fields) != 5:
        raise ConfigurationError(
            f"cron {expression!r} has {len(fields)} fields: use 5 (minute hour day-of-month month day-of-week)"
        )
    try:
        CronSim(expression, datetime(2000, 1, 1))
    except CronSimError as error:
        raise ConfigurationError(f"cron {expression!r} is not valid: {error}") from None
    return " ".join(fields)


def check_timezone(name: Any) -> ZoneInfo:
    """The ``ZoneInfo`` of ``name``; :class:`ConfigurationError` when this machine does not know it."""
    if not isinstance(name, str) or not name or len(name) > MAX_TIMEZONE_LENGTH:
        raise ConfigurationError(f"timezone must be an IANA time zone name such as 'Europe/Paris', got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"Unknown time zone {name!r}: use an IANA name such as 'Europe/Paris' (on a machine without the "
            "system's tz database, install tzdata)"
        ) from None


def check_every(value: Any) -> timedelta:
    """``value`` as a ``timedelta`` of at least :data:`MIN_EVERY`; else :class:`ConfigurationError`."""
    every = coerce_duration(value, "every")
    if every < MIN_EVERY:
        raise ConfigurationError(f"every must be at least {MIN_EVERY.total_seconds():g} second, got {value!r}")
    if every > MAX_EVERY:
        raise ConfigurationError(f"every must be at most {MAX_EVERY.days} days, got {value!r}")
    if every % timedelta(seconds=1):
        raise ConfigurationError(f"every must be a whole number of seconds, got {value!r}")
    return every


def check_policies(overlap: Any, catchup: Any, jitter: Any) -> timedelta | None:
    """Raise :class:`ConfigurationError` for an unknown policy; returns ``jitter`` as a timedelta."""
    if overlap not in OVERLAP_POLICIES:
        raise ConfigurationError(f"Unknown overlap {overlap!r}: use one of {', '.join(OVERLAP_POLICIES)}")
    if catchup not in CATCHUP_POLICIES:
        raise ConfigurationError(f"Unknown catchup {catchup!r}: use one of {', '.join(CATCHUP_POLICIES)}")
    if jitter is None:
        return None
    duration = coerce_duration(jitter, "jitter")
    if duration > MAX_EVERY:
        raise ConfigurationError(f"jitter must be at most {MAX_EVERY.days} days, got {jitter!r}")
    return duration or None


@dataclass(frozen=True, init=False)
class Schedule:
    """When to start a run: ``Schedule(cron="0 3 * * *", timezone="Europe/Paris")`` or ``Schedule(every=...)``.

    Declared in a workflow class's ``schedules = [...]`` (synced to a ``WorkflowSchedule`` row
    by the dispatcher) or given to ``Cls.add_schedule(...)``. Exactly one of ``cron`` (5
    fields, in ``timezone``) and ``every`` (a duration). ``name`` defaults to the expression;
    it identifies the schedule within its class, so keep it when you change the expression.
    """

    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    arguments: dict[str, Any] | None = None
    name: str = ""
    overlap: str = "skip"
    catchup: str = "latest"
    jitter: timedelta | None = None
    enabled: bool = True

    def __init__(
        self,
        cron: str | None = None,
        *,
        every: timedelta | int | float | None = None,
        timezone: str = "UTC",
        arguments: dict[str, Any] | None = None,
        name: str | None = None,
        overlap: str = "skip",
        catchup: str = "latest",
        jitter: timedelta | int | float | None = None,
        enabled: bool = True,
    ) -> None:
        if (cron is None) == (every is None):
            raise ConfigurationError("A Schedule takes exactly one of cron= and every=")
        check_timezone(timezone)
        if arguments is not None and not isinstance(arguments, dict):
            raise ConfigurationError(f"Schedule arguments must be a dict of JSON values, got {arguments!r}")
        if name is not None and (not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH):
            raise ConfigurationError(
                f"Schedule name must be a non-empty string of at most {MAX_NAME_LENGTH} characters"
            )
        if not isinstance(enabled, bool):
            raise ConfigurationError(f"Schedule enabled must be True or False, got {enabled!r}")
        checked_cron = None if cron is None else check_cron(cron)
        checked_every = None if every is None else check_every(every)
        values = {
            "name": name or default_name(checked_cron, checked_every),
            "cron": checked_cron,
            "every": checked_every,
            "timezone": timezone,
            "arguments": dict(arguments or {}),
            "overlap": overlap,
            "catchup": catchup,
            "jitter": check_policies(overlap, catchup, jitter),
            "enabled": enabled,
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def row_values(self) -> dict[str, Any]:
        """The ``WorkflowSchedule`` columns this declaration sets."""
        return {
            "cron": self.cron or "",
            "every": self.every,
            "timezone": self.timezone,
            "arguments": self.arguments,
            "overlap": self.overlap,
            "catchup": self.catchup,
            "jitter": self.jitter,
            "enabled": self.enabled,
        }


def default_name(cron: str | None, every: timedelta | None) -> str:
    """The name of a schedule that was given none: its expression (stable while the expression is)."""
    if cron is not None:
        return f"cron {cron}"
    return f"every {int(every.total_seconds())}s"  # type: ignore[union-attr]


def declared_schedules(cls: type) -> tuple[Schedule, ...]:
    """The class's ``schedules``, checked: a list of :class:`Schedule` with distinct names."""
    declared = cls.__dict__.get("schedules", ())
    if not isinstance(declared, list | tuple) or not all(isinstance(s, Schedule) for s in declared):
        raise ConfigurationError(f"{cls.__qualname__}.schedules must be a list of Schedule")
    names = [s.name for s in declared]
    for name in names:
        if names.count(name) > 1:
            raise ConfigurationError(f"{cls.__qualname__}.schedules has two schedules named {name!r}: give one a name=")
    if declared and cls.__dict__.get("abstract", False):
        raise ConfigurationError(f"{cls.__qualname__} is abstract: declare its schedules on a subclass")
    for schedule in declared:
        check_arguments(schedule.arguments, f"{cls.__qualname__}.schedules {schedule.name!r}")
    return tuple(declared)


def check_arguments(arguments: Any, what: str) -> None:
    """:class:`ConfigurationError` unless ``arguments`` can be stored as JSON, as a run's arguments are.

    Checked when the class is defined, so a declaration the leader could never store or start
    fails at import time rather than on every sync.
    """
    try:
        json.dumps(arguments, cls=DjangoJSONEncoder, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        raise ConfigurationError(f"{what}: arguments must be JSON-serialisable (DjangoJSONEncoder): {error}") from None


def next_tick(cron: str, every: timedelta | None, timezone: str, after: datetime) -> datetime:
    """The first tick strictly after ``after`` (an aware datetime), in UTC."""
    if every is not None:
        periods = (after - EPOCH) // every + 1
        return EPOCH + periods * every
    zone = ZoneInfo(timezone)
    # cronsim iterates from the start time: whole minutes, the start itself excluded.
    local = after.astimezone(zone).replace(second=0, microsecond=0)
    for tick in CronSim(cron, local):
        if tick > after:
            return tick.astimezone(UTC)
    raise ConfigurationError(f"cron {cron!r} never fires")  # pragma: no cover - cronsim raises first


def latest_tick(cron: str, every: timedelta | None, timezone: str, at: datetime) -> datetime:
    """The last tick at or before ``at``, in UTC."""
    if every is not None:
        return EPOCH + ((at - EPOCH) // every) * every
    zone = ZoneInfo(timezone)
    start = (at + timedelta(minutes=1)).astimezone(zone).replace(second=0, microsecond=0)
    candidate = next(t for t in CronSim(cron, start, reverse=True) if t <= at).astimezone(UTC)
    # Backwards, cronsim compares wall-clock times: in an hour that a fall-back change repeats
    # it can step over a tick. Forwards it never does, so walk forwards to the last one.
    while (following := next_tick(cron, None, timezone, candidate)) <= at:
        candidate = following
    return candidate


def jitter_offset(jitter: timedelta | None, key: str, tick: datetime) -> timedelta:
    """How long after ``tick`` its run starts: in ``[0, jitter)``, the same on every host for one tick."""
    if not jitter:
        return timedelta(0)
    digest = hashlib.sha256(f"{key}|{tick.isoformat()}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return timedelta(microseconds=int(jitter / timedelta(microseconds=1) * fraction))


def describe(cron: str, every: timedelta | None) -> str:
    """The schedule in words: "At 03:00", "Every 15 minutes"."""
    if every is not None:
        seconds = int(every.total_seconds())
        for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
            if seconds % size == 0:
                count = seconds // size
                return f"Every {unit}" if count == 1 else f"Every {count} {unit}s"
        return "Every second" if seconds == 1 else f"Every {seconds} seconds"
    text: str = CronSim(cron, datetime(2000, 1, 1)).explain()
    return re.sub(r"\s+", " ", text)
