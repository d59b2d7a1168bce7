"""Health: one verdict and its reasons, for ``manage.py workflows health``, the health view and MCP.

A read model: it writes nothing, and every read goes through indexes (the gauge's counts, one
probe of the due index per priority, the small dispatchers and schedules tables), so an
uptime check may call it every few seconds whatever the size of the history.

Not healthy when: no dispatcher heartbeats within ``DISPATCHER_DEAD_AFTER``; a run is stalled
(an attempt past its stall deadline), overdue (a step due for longer than ``STALL_THRESHOLD``)
or has a fan-out whose jobs all ended without its resolution; a schedule's last tick failed.
Worth a look but healthy: runs paused on an error, signal waits past
``WAITING_VISIBILITY_THRESHOLD``, steps held back by their limits, dispatcher rows whose
process is gone, classes and queues an operator holds (held on purpose: their due steps are
not counted overdue), a ``READ_DATABASE`` further behind the primary than ``READ_MAX_LAG`` (or that
cannot tell, or be read): the engine never reads it, only the pages and read tools do.

The verdict reads the primary, even inside ``models.reading.reading()``: it says what is true now.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, DatabaseError
from django.db.models import F, Q

from ..conf import settings
from ..models import Dispatcher, WorkflowHold, WorkflowSchedule
from ..models.reading import reading
from ..sql import clock
from ..sql.counting import oldest_due_at
from ..sql.replica import read_lag
from .limiting import held_back_counts
from .stuck import STUCK_REASONS, stuck_counts

#: Stuck reasons that make the verdict "not healthy" (the others are notes).
UNHEALTHY_STUCK = ("stalled", "overdue", "fan_out_unresolved")
#: What each stuck reason means, for a reason's sentence.
STUCK_WORDS = {
    "stalled": "with an attempt past its stall deadline",
    "overdue": "with a step due for longer than STALL_THRESHOLD",
    "waiting_overdue": "waiting for a signal for longer than WAITING_VISIBILITY_THRESHOLD",
    "paused_on_error": "paused on an error",
    "fan_out_unresolved": "with a fan-out whose jobs all ended, not yet resolved",
}


@dataclass(frozen=True)
class DispatcherBeat:
    """One dispatcher row: its name, host, last heartbeat and whether that is recent enough to be alive."""

    name: str
    hostname: str
    heartbeat_at: datetime
    heartbeat_age_seconds: float
    alive: bool


@dataclass(frozen=True)
class Health:
    """The verdict (``healthy``), why not (``reasons``), what is worth a look (``notes``), and the figures."""

    healthy: bool
    reasons: list[str]
    notes: list[str]
    checked_at: datetime
    dispatchers: list[DispatcherBeat]
    #: Runs by stuck reason, every reason (zero included).
    stuck: dict[str, int]
    #: Seconds the longest-waiting due step has waited since it came due (None: nothing is due).
    oldest_due_seconds: float | None
    #: Due steps held back by a concurrency key or rate limit with no room.
    held_back: int
    #: Schedules whose last tick failed: ``{"workflow_class", "name", "last_error", "last_error_at"}``.
    failing_schedules: list[dict[str, Any]]
    #: Classes and queues an operator holds (``services.holding``): kind, name, held_at, held_by, reason.
    holds: list[dict[str, Any]]
    #: The ``READ_DATABASE`` and its lag (``sql.replica.ReadLag.as_dict``); None when it is the primary.
    read_database: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The whole report as JSON-ready values (datetimes as ISO 8601)."""
        report: dict[str, Any] = _jsonable(asdict(self))
        return report


def check_health(now: datetime | None = None) -> Health:
    """Read everything the verdict needs, on the primary, and give it, with its reasons and notes."""
    with reading(DEFAULT_DB_ALIAS):
        return _check(now or clock.now())


def _check(now: datetime) -> Health:
    beats = _beats(now)
    stuck = dict.fromkeys(STUCK_REASONS, 0)
    for (_klass, reason), count in stuck_counts(now).items():
        stuck[reason] += count
    due_at = oldest_due_at(now)
    held = sum(held_back_counts(now).values())
    failing = _failing_schedules()
    active = WorkflowHold.objects.active().order_by("held_at")
    holds = cast(list[dict[str, Any]], list(active.values("kind", "name", "held_at", "held_by", "reason")))
    reasons: list[str] = []
    notes: list[str] = []
    if not any(beat.alive for beat in beats):
        last = max((beat.heartbeat_at for beat in beats), default=None)
        since = "no dispatcher has registered" if last is None else f"the last heartbeat was at {last.isoformat()}"
        reasons.append(f"no dispatcher is alive ({since})")
    for reason in STUCK_REASONS:
        if stuck[reason]:
            sentence = f"{_runs(stuck[reason])} {STUCK_WORDS[reason]}"
            (reasons if reason in UNHEALTHY_STUCK else notes).append(sentence)
    for schedule in failing:  # its error stays in failing_schedules: a message may quote data
        name, failed_at = f"{schedule['workflow_class']}/{schedule['name']}", schedule["last_error_at"]
        reasons.append(f"schedule {name} failed at {failed_at.isoformat()}")
    if held:
        notes.append(f"{held} due step{'s' if held != 1 else ''} held back by their limits")
    for hold in holds:  # a note, not a reason: held on purpose, and its due steps are not counted overdue
        notes.append(f"{hold['kind']} {hold['name']} held since {hold['held_at'].isoformat()} by {hold['held_by']}")
    gone = [beat.name for beat in beats if not beat.alive]
    if gone and any(beat.alive for beat in beats):
        notes.append(f"dispatcher rows whose process is gone: {', '.join(gone)}")
    read_database = _read_database(notes)
    return Health(
        healthy=not reasons,
        reasons=reasons,
        notes=notes,
        checked_at=now,
        dispatchers=beats,
        stuck=stuck,
        oldest_due_seconds=None if due_at is None else max((now - due_at).total_seconds(), 0.0),
        held_back=held,
        failing_schedules=failing,
        holds=holds,
        read_database=read_database,
    )


def _read_database(notes: list[str]) -> dict[str, Any] | None:
    """The ``READ_DATABASE``'s lag (None: it is the primary), noting it when past ``READ_MAX_LAG`` or unknown."""
    alias = settings.READ_DATABASE
    if alias == DEFAULT_DB_ALIAS:
        return None
    try:
        lag = read_lag(alias)
    except DatabaseError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        notes.append(f"the read database {alias!r} cannot be read: {first}")
        return {"database": alias, "standby": None, "lag_seconds": None}
    limit = settings.READ_MAX_LAG.total_seconds()
    if lag.seconds is None:
        notes.append(f"the read database {alias!r} cannot tell its lag yet (no transaction replayed)")
    elif lag.seconds > limit:
        notes.append(
            f"the read database {alias!r} is {lag.seconds:.1f} s behind the primary (READ_MAX_LAG {limit:g} s)"
        )
    return lag.as_dict()


def _beats(now: datetime) -> list[DispatcherBeat]:
    dead_after = settings.DISPATCHER_DEAD_AFTER
    beats = []
    for name, hostname, heartbeat_at in Dispatcher.objects.order_by("name").values_list(
        "name", "hostname", "heartbeat_at"
    ):
        age = max((now - heartbeat_at).total_seconds(), 0.0)
        beats.append(DispatcherBeat(name, hostname, heartbeat_at, age, now - heartbeat_at <= dead_after))
    return beats


def _failing_schedules() -> list[dict[str, Any]]:
    """Enabled, unpaused schedules whose last error is newer than their last tick."""
    failing = WorkflowSchedule.objects.filter(enabled=True, paused=False, last_error_at__isnull=False).filter(
        Q(last_fired_at__isnull=True) | Q(last_error_at__gt=F("last_fired_at"))
    )
    fields = ("workflow_class", "name", "last_error", "last_error_at")
    return [dict(zip(fields, row, strict=True)) for row in failing.order_by(*fields[:2]).values_list(*fields)]


def _runs(count: int) -> str:
    return f"{count} run{'s' if count != 1 else ''}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value
