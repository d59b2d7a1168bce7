"""What a tool answers: JSON-ready values, redacted by what each value is built from unless the settings show them.

Every tool's result passes through :func:`response` (``server.BoundTool`` calls it, never the
tool), so a tool that returns a payload by mistake still hides it. Fields are recognised by
name, at any depth:

- always hidden: what is built from a run's data — its arguments, its ``idempotency_key``
  (the caller's, often computed from them), an attempt's output, error message and
  traceback, a signal's payload and key, an event's details, a schedule's last error;
- a ``reason`` is hidden when the engine built it from an error's message (the events of
  :data:`ERROR_REASON_KINDS`), or when nothing beside it says who wrote it; an operator's or
  the application's reason for its own verb (a pause, a resume, a cancel) is shown, as its
  actor is;
- a run's ``paused_reason`` likewise, by the kind of event that paused it (``paused_by``);
- a limit's ``key`` is shown when the code fixes it (``fixed_key``), and a run's
  ``debounce_key`` when the code or the subject gives it (``debounce_key_from``); either is
  hidden when a callable computed it from the run's arguments, or when nothing says.

Empty values stay as they are, so the assistant can tell "nothing" from "hidden".
"""

from __future__ import annotations

import json
from typing import Any

from ..conf import settings
from ..operating.terminal import ExactJSONEncoder

#: What a redacted value reads as: it says how to show it.
PLACEHOLDER = "[redacted: set PGBUS_WORKFLOWS['MCP_SHOW_PAYLOADS'] = True to show]"

#: The fields built from a run's data or an error's message, wherever they are.
REDACTED_FIELDS = frozenset(
    {
        "arguments",  # a run's
        "idempotency_key",  # a run's or a signal's: often computed from the arguments or the payload
        "output",  # an attempt's
        "error_message",  # an attempt's error, which often quotes its arguments
        "traceback",  # an attempt's, with the values of the frames' lines
        "last_error",  # a schedule's, an error's message
        "payload",  # a signal's
        "details",  # an event's
    }
)
#: The event kinds whose reason the engine writes an error's message into.
ERROR_REASON_KINDS = frozenset({"step_failed", "sweep_failed"})


def json_ready(value: Any) -> Any:
    """``value`` as JSON reads it back: times in ISO 8601 to the microsecond, durations in ISO 8601, UUIDs as text."""
    return json.loads(json.dumps(value, cls=ExactJSONEncoder))


def redact(value: Any) -> Any:
    """``value`` with each non-empty field built from data replaced by :data:`PLACEHOLDER`, at any depth."""
    if isinstance(value, dict):
        return {key: PLACEHOLDER if _hidden(value, key) else redact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


def _hidden(row: dict[str, Any], key: str) -> bool:
    """Whether ``row[key]`` is built from data, judged by its name and by what its row says of its source."""
    if row[key] in (None, "", {}, []):
        return False
    if key in REDACTED_FIELDS:
        return True
    if key == "reason":
        return row.get("kind") in ERROR_REASON_KINDS or not isinstance(row.get("actor"), str)
    if key == "paused_reason":
        return row.get("paused_by") in ERROR_REASON_KINDS or not isinstance(row.get("paused_by"), str)
    if key == "key":
        return row.get("fixed_key") is not True
    if key == "debounce_key":
        return row.get("debounce_key_from") not in ("code", "subject")
    return False


def response(result: dict[str, Any]) -> dict[str, Any]:
    """A tool's result as the client gets it: JSON-ready, redacted unless ``MCP_SHOW_PAYLOADS``."""
    ready: dict[str, Any] = json_ready(result)
    return ready if settings.MCP_SHOW_PAYLOADS else redact(ready)
