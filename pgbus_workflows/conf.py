"""The app's settings: one object, read live from ``settings.PGBUS_WORKFLOWS``.

Values are read on first use (never at import time) and kept until Django says the setting
changed (``setting_changed``: ``override_settings``, pytest-django's ``settings`` fixture), so
those work; a dispatcher reads its settings on its hot path, where parsing them on each
access cost more than the lock it took.
Durations may be given as seconds or as ``timedelta``; they are always returned as
``timedelta``. ``checks.py`` validates the whole dict with clear messages.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

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

    def reload(self) -> None:
        """Forget the values read so far: the next access reads ``PGBUS_WORKFLOWS`` again."""
        for name in DEFAULTS:
            self.__dict__.pop(name, None)

    def user_values(self) -> dict[str, Any]:
        """The raw dict the project set (empty when it set none)."""
        value = getattr(django_settings, "PGBUS_WORKFLOWS", None)
        return dict(value) if isinstance(value, dict) else {}

    def __getattr__(self, name: str) -> Any:
        """A setting's value, read on first use and then kept as an attribute (until :meth:`reload`)."""
        if name not in DEFAULTS:
            raise AttributeError(f"PGBUS_WORKFLOWS has no setting {name!r}")
        value = self.user_values().get(name, DEFAULTS[name])
        if name == "RETENTION" and not isinstance(value, bool) and value in (0, timedelta(0)):
            value = None  # as in pgbus: 0 turns the cleanup off
        elif name in DURATION_KEYS and value is not None:
            value = as_duration(value)
        self.__dict__[name] = value
        return value


settings = WorkflowSettings()


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    """``PGBUS_WORKFLOWS`` changed (a test's override): read it again."""
    if setting == "PGBUS_WORKFLOWS":
        settings.reload()
