"""The app's settings: one object, read live from ``settings.PGBUS_WORKFLOWS``.

Values are read on first use (never at import time) and kept for as long as Django serves
the same settings: every ``override_settings`` (pytest-django's ``settings`` fixture too,
deleting a setting included, which sends no ``setting_changed``) puts another settings
object in place, so those work, and a value another thread read from the settings before is
never kept. A dispatcher reads its settings on its hot path, where parsing them on each
access cost it 8 % of its CPU.
Durations may be given as seconds or as ``timedelta``; they are always returned as
``timedelta``. ``checks.py`` validates the whole dict with clear messages.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings

#: Every key with its default. Durations are in seconds here.
DEFAULTS: dict[str, Any] = {
    "SWEEP_INTERVAL": 60,
    "STALL_THRESHOLD": 3600,
    "STALL_ACTION": "reattempt",
    "RETENTION": 30 * 24 * 3600,
    "WAITING_VISIBILITY_THRESHOLD": 24 * 3600,
    "MAX_PAYLOAD_SIZE": 65536,
    "DEFAULT_QUEUE": "workflows",
    "POLL_INTERVAL": 1,
    "HEARTBEAT_INTERVAL": 10,
    "DISPATCHER_DEAD_AFTER": 60,
    "NOTIFY_CHANNEL": "pgbus_workflows",
    "AUTODISCOVER_MODULE": "workflows",
    "BATCH_SIZE": 100,
    "MAX_STALLS": 5,
    "UNKNOWN_STEP_GRACE": 600,
    "PREPARED_STATEMENTS": True,
    "MAX_CHILD_DEPTH": 10,
    "ASYNC_CONCURRENCY": 100,
    # manage.py workflows_mcp: whether the operator verbs are offered as tools at all, and
    # whether tool results show payloads (arguments, outputs, error messages, signal payloads).
    "MCP_WRITE_TOOLS": False,
    "MCP_SHOW_PAYLOADS": False,
}

#: Keys whose value is a duration. ``RETENTION`` also accepts ``None`` or ``0`` (keep forever).
DURATION_KEYS = frozenset(
    {
        "SWEEP_INTERVAL",
        "STALL_THRESHOLD",
        "RETENTION",
        "WAITING_VISIBILITY_THRESHOLD",
        "POLL_INTERVAL",
        "HEARTBEAT_INTERVAL",
        "DISPATCHER_DEAD_AFTER",
        "UNKNOWN_STEP_GRACE",
    }
)

STALL_ACTIONS = ("reattempt", "pause", "cancel")
#: What :class:`WorkflowSettings` has read from before its first read (not any settings object).
_NOTHING_READ = object()
_object_attribute = object.__getattribute__


def as_duration(value: Any) -> timedelta:
    """Return ``value`` (seconds or a ``timedelta``) as a ``timedelta``."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected seconds or a timedelta, got {value!r}")
    return timedelta(seconds=value)


class WorkflowSettings:
    """Typed access to ``PGBUS_WORKFLOWS``, with the defaults of ``DEFAULTS``."""

    SWEEP_INTERVAL: timedelta
    STALL_THRESHOLD: timedelta
    STALL_ACTION: str
    RETENTION: timedelta | None
    WAITING_VISIBILITY_THRESHOLD: timedelta
    MAX_PAYLOAD_SIZE: int
    DEFAULT_QUEUE: str
    POLL_INTERVAL: timedelta
    HEARTBEAT_INTERVAL: timedelta
    DISPATCHER_DEAD_AFTER: timedelta
    NOTIFY_CHANNEL: str
    AUTODISCOVER_MODULE: str | None
    BATCH_SIZE: int
    MAX_STALLS: int | None
    UNKNOWN_STEP_GRACE: timedelta
    PREPARED_STATEMENTS: bool
    MAX_CHILD_DEPTH: int
    ASYNC_CONCURRENCY: int
    MCP_WRITE_TOOLS: bool
    MCP_SHOW_PAYLOADS: bool

    def __init__(self) -> None:
        #: The settings object the values were read from, and the values read so far.
        self._read: tuple[object, dict[str, Any]] = (_NOTHING_READ, {})

    def __getattr__(self, name: str) -> Any:
        """A setting's value, read on first use and kept while Django serves the same settings."""
        # The object behind Django's lazy settings: override_settings swaps it. Read past
        # LazySettings' own __getattribute__, which costs more than the rest of this.
        serving = _object_attribute(django_settings, "_wrapped")
        read_from, values = self._read
        if read_from is not serving:
            values = {}
            self._read = (serving, values)
        elif name in values:
            return values[name]
        if name not in DEFAULTS:
            raise AttributeError(f"PGBUS_WORKFLOWS has no setting {name!r}")
        source = getattr(django_settings, "PGBUS_WORKFLOWS", None)
        value = source.get(name, DEFAULTS[name]) if isinstance(source, dict) else DEFAULTS[name]
        if name == "RETENTION" and not isinstance(value, bool) and value in (0, timedelta(0)):
            value = None  # as in pgbus: 0 turns the cleanup off
        elif name in DURATION_KEYS and value is not None:
            value = as_duration(value)
        values[name] = value
        return value


settings = WorkflowSettings()
