"""How ``manage.py workflows`` prints for people: aligned tables and a run's page as text.

``--json`` prints the same dicts as JSON instead (``DjangoJSONEncoder``, times in ISO 8601 to the microsecond).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from ..services.limiting import describe

#: The widest a table cell or a field of ``show`` gets (longer text ends in "..."; ``show --full``
#: and ``--json`` have it whole).
MAX_CELL = 60


class ExactJSONEncoder(DjangoJSONEncoder):
    """``DjangoJSONEncoder`` with times to the microsecond (it keeps milliseconds), as the rows hold them."""

    def default(self, o: Any) -> Any:
        """A datetime in ISO 8601 with its microseconds; anything else as ``DjangoJSONEncoder`` has it."""
        if isinstance(o, datetime):
            return o.isoformat()
        return super().default(o)


def to_json(value: Any) -> str:
    """One JSON document, indented, as scripts read it (times to the microsecond)."""
    return json.dumps(value, cls=ExactJSONEncoder, indent=2, ensure_ascii=False)


def cell(value: Any, full: bool = False) -> str:
    """A value as a table cell: times local to the second, JSON compact, nothing as ``-``, on one line.

    Cut to :data:`MAX_CELL` characters unless ``full``.
    """
    if value is None or value == "":
        text = "-"
    elif isinstance(value, datetime):
        text = timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")
    elif isinstance(value, dict | list):
        text = json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False, sort_keys=True)
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if full or len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], full: bool = False) -> list[str]:
    """Lines of an aligned table: ``columns`` are ``(key in each row, heading)``; the last column is not padded.

    ``full``: no cell is cut short.
    """
    cells = [[heading.upper() for _key, heading in columns]]
    cells += [[cell(row.get(key), full) for key, _heading in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return ["  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip() for line in cells]


RUN_COLUMNS = [
    ("workflow_id", "run"),
    ("workflow_class", "class"),
    ("status", "status"),
    ("current_step", "step"),
    ("attempt", "attempt"),
    ("subject", "subject"),
    ("status_changed_at", "status changed"),
]

ATTEMPT_COLUMNS = [
    ("step_name", "step"),
    ("attempt", "#"),
    ("status", "status"),
    ("outcome", "outcome"),
    ("scheduled_at", "scheduled"),
    ("started_at", "started"),
    ("finished_at", "finished"),
    ("note", "error / waits for / output"),
]

EVENT_COLUMNS = [
    ("created_at", "time"),
    ("kind", "event"),
    ("move", "status"),
    ("actor", "actor"),
    ("reason", "reason"),
]

SIGNAL_COLUMNS = [
    ("id", "id"),
    ("name", "name"),
    ("received_at", "received"),
    ("actor", "actor"),
    ("payload", "payload"),
]

#: How ``show`` names a verb the run may take: as it is typed (``--json`` has the verbs' own names).
TYPED = {"resume_at": "resume --at STEP", "run_now": "run-now"}

#: ``show``'s header: (key, label).
RUN_FIELDS = [
    ("workflow_class", "class"),
    ("status", "status"),
    ("paused_reason", "paused because"),
    ("current_step", "current step"),
    ("subject", "subject"),
    ("arguments", "arguments"),
    ("idempotency_key", "idempotency key"),
    ("debounce_key", "debounce key"),
    ("started_by", "started by"),
    ("start_reason", "start reason"),
    ("rerun_of", "rerun of"),
    ("parent", "parent run"),
    ("children", "children"),
    ("created_at", "created"),
    ("started_at", "started"),
    ("status_changed_at", "status changed"),
    ("finished_at", "finished"),
]


def attempt_note(attempt: dict[str, Any]) -> Any:
    """The one thing worth reading about an attempt: its error, what it waits for, its fan-out, its output."""
    if attempt["error_class"]:
        return f"{attempt['error_class']}: {attempt['error_message']}"
    if attempt["fan_out"] is not None:
        done = attempt["fan_out"]
        return (
            f"fan-out {done['succeeded']}/{done['total']} done, {done['failed']} failed, "
            f"{done['cancelled']} cancelled, {done['pending']} pending"
        )
    if attempt["status"] == "waiting" and attempt["wait_for"]:
        return "waits for " + ", ".join(attempt["wait_for"])
    return attempt["output"]


def run_page(page: dict[str, Any], full: bool = False) -> list[str]:
    """``show``'s text: the run's fields, the verbs it may take, its attempts, events and pending signals.

    Long values are cut to :data:`MAX_CELL` characters, ending in "...", unless ``full``.
    """
    run = page["run"]
    lines = [f"Run {run['workflow_id']}"]
    width = max(len(label) for _key, label in RUN_FIELDS)
    lines += [
        f"  {label.ljust(width)}  {cell(run[key], full)}" for key, label in RUN_FIELDS if run[key] not in (None, "")
    ]
    verbs = ", ".join(TYPED.get(verb, verb) for verb in page["allowed_verbs"]) or "none"
    lines.append(f"  {'may now'.ljust(width)}  {verbs}")
    if page.get("held_back"):
        held = page["held_back"]
        lines.append(f"  {'held back'.ljust(width)}  step {held['step']} by {describe(held['limits'])}")
    if page.get("undeclared_limits"):
        names = ", ".join(page["undeclared_limits"])
        lines.append(f"  {'limits'.ljust(width)}  {names}: no code declares them any more (claimed within their rows)")
    sections = [
        ("Attempts", "attempts", "older_attempts_omitted", ATTEMPT_COLUMNS, "--attempts"),
        ("Events", "events", "older_events_omitted", EVENT_COLUMNS, "--events"),
        ("Pending signals", "pending_signals", "more_signals_omitted", SIGNAL_COLUMNS, "--signals"),
    ]
    for title, key, omitted, columns, flag in sections:
        rows = page[key]
        lines.append("")
        if rows is None:
            lines.append(f"{title}: not shown (no view permission)")
            continue
        if not rows:
            lines.append(f"{title}: none")
            continue
        more = page[omitted]
        note = f" (the {'oldest' if key == 'pending_signals' else 'latest'} {len(rows)}; raise {flag} for more)"
        lines.append(f"{title}{note if more else ''}")
        if key == "attempts":
            rows = [{**row, "note": attempt_note(row)} for row in rows]
        if key == "events":
            rows = [{**row, "move": _move(row)} for row in rows]
        lines += ["  " + line for line in table(rows, columns, full)]
    if not full and lines != run_page(page, full=True):  # some value was cut: say how to see it whole
        lines += ["", "Values longer than 60 characters end in '...': show --full prints them whole."]
    return lines


def _move(event: dict[str, Any]) -> str:
    if not event["to_status"]:
        return ""
    return f"{event['from_status'] or '-'} -> {event['to_status']}"


def health_lines(report: dict[str, Any]) -> list[str]:
    """``workflows health``: the verdict, its reasons and notes, then the dispatchers and the figures."""
    lines = ["healthy" if report["healthy"] else "NOT HEALTHY"]
    lines += [f"  - {reason}" for reason in report["reasons"]]
    lines += [f"  note: {note}" for note in report["notes"]]
    beats = [
        {**beat, "alive": "yes" if beat["alive"] else "no", "age": f"{beat['heartbeat_age_seconds']:.0f} s"}
        for beat in report["dispatchers"]
    ]
    columns = [("name", "DISPATCHER"), ("hostname", "HOST"), ("alive", "ALIVE"), ("age", "LAST BEAT")]
    lines += ["", *(table(beats, columns) if beats else ["No dispatcher has registered."])]
    oldest = report["oldest_due_seconds"]
    stuck = ", ".join(f"{reason} {count}" for reason, count in report["stuck"].items())
    lines += [
        "",
        f"oldest due step: {'nothing is due' if oldest is None else f'due for {oldest:.1f} s'}",
        f"held back by limits: {report['held_back']}",
        f"stuck runs: {stuck}",
        f"failing schedules: {len(report['failing_schedules'])}",
    ]
    read = report.get("read_database")
    if read is not None:
        lag = "unknown" if read["lag_seconds"] is None else f"{read['lag_seconds']:.1f} s"
        lines.append(f"read database {read['database']!r}: {lag} behind the primary")
    return lines
