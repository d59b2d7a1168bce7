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
    # whether tool results show payloads (arguments, outputs, error messages, signal payloads),
    # and the most bytes one reply takes on the wire (1 MiB).
    "MCP_WRITE_TOOLS": False,
    "MCP_SHOW_PAYLOADS": False,
    "MCP_MAX_RESPONSE_BYTES": 1024 * 1024,
    # The Django database alias the read-only pages and commands read from (a replica), and how far
    # behind the primary it may be before the health report notes it.
    "READ_DATABASE": "default",
    "READ_MAX_LAG": 30,
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
        "READ_MAX_LAG",
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

    #: How often the sweep runs: stalled attempts, dead dispatchers, wait timeouts, retention, the gauge.
    SWEEP_INTERVAL: timedelta
    #: An attempt running longer than this, in a step without ``timeout=``, is stalled.
    STALL_THRESHOLD: timedelta
    #: What the sweep does with a stalled attempt: ``"reattempt"``, ``"pause"`` or ``"cancel"``.
    STALL_ACTION: str
    #: Finished and cancelled runs, and schedule events, older than this are deleted (``None`` or ``0`` keeps
    #: them).
    RETENTION: timedelta | None
    #: A run waiting longer than this, without a timeout, counts as ``waiting_overdue``.
    WAITING_VISIBILITY_THRESHOLD: timedelta
    #: UTF-8 bytes of JSON allowed for arguments, outputs, signal payloads and job arguments (else
    #: ``PayloadTooLarge``).
    MAX_PAYLOAD_SIZE: int
    #: The queue of steps that name none (at most 255 characters, check E010).
    DEFAULT_QUEUE: str
    #: How often a dispatcher polls for due steps when no NOTIFY wakes it.
    POLL_INTERVAL: timedelta
    #: How often a dispatcher writes its heartbeat.
    HEARTBEAT_INTERVAL: timedelta
    #: A dispatcher silent this long is dead: the sweep stalls the steps it held. One whose LISTEN session
    #: is gone (a killed process) is dead once silent for two heartbeat intervals.
    DISPATCHER_DEAD_AFTER: timedelta
    #: The LISTEN/NOTIFY channel dispatchers wake on (at most 63 bytes, check E010).
    NOTIFY_CHANNEL: str
    #: The module imported from every installed app to register workflows (``None`` turns discovery off).
    AUTODISCOVER_MODULE: str | None
    #: The most step outcomes a dispatcher worker commits in one transaction (``1`` turns batching off).
    BATCH_SIZE: int
    #: A step stalled again after this many stalled-and-reattempted attempts in a row pauses its run; a fan-out
    #: job stalled this many times fails (``None``: for ever).
    MAX_STALLS: int | None
    #: How long a due step that no live dispatcher's code defines waits for one before the sweep pauses its run
    #: with ``StepNotDefined``; a fan-out job whose function cannot be imported waits as long, then fails.
    UNKNOWN_STEP_GRACE: timedelta
    #: Whether a dispatcher whose LISTEN check passed prepares the engine's statements on the server; ``False``
    #: for a transaction-mode pool that keeps no prepared statements (PgBouncer before 1.21, or without
    #: ``max_prepared_statements``).
    PREPARED_STATEMENTS: bool
    #: How deep child workflows may nest: a fan-out whose children would be deeper fails with
    #: ``ChildDepthExceeded``.
    MAX_CHILD_DEPTH: int
    #: How many ``async def`` bodies a dispatcher awaits at once on its event loop (``--async-concurrency``
    #: overrides it; past them, and with ``0``, each holds its worker thread while it awaits on that loop).
    ASYNC_CONCURRENCY: int
    #: Whether ``manage.py workflows_mcp`` offers the write tools (pause, resume, cancel, skip, resume at, run
    #: now, signal).
    MCP_WRITE_TOOLS: bool
    #: Whether MCP tool results show payloads (arguments, outputs, error messages, signal payloads) and the keys
    #: computed from them instead of redacting them.
    MCP_SHOW_PAYLOADS: bool
    #: The most bytes one MCP tool reply takes on the wire (one stdio line): a larger answer has its largest
    #: values cut, each replaced by a marker that says so.
    MCP_MAX_RESPONSE_BYTES: int
    #: The ``DATABASES`` alias the admin's lists, dashboard and insights, the metrics scrape and the CLI's and
    #: MCP's read tools read from (a streaming replica); verbs, claims, starts, signals and the sweep read and
    #: write the primary (``default``) whatever it says (check E017).
    READ_DATABASE: str
    #: A ``READ_DATABASE`` further behind the primary than this is a note of the health report.
    READ_MAX_LAG: timedelta

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
