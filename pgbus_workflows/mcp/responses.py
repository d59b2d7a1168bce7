"""What a tool answers: JSON-ready values, with payloads redacted unless the settings show them.

Every tool's result passes through :func:`response` (``server.BoundTool`` calls it, never the
tool), so a tool that returns a payload by mistake still hides it. Fields are recognised by
name, at any depth: a run's arguments, an attempt's output and error message, a signal's
payload, an event's details, and the reasons the engine writes an error's message into (a
``step_failed`` event's, a run's ``paused_reason``). Empty values stay as they are, so the
assistant can tell "nothing" from "hidden".
"""

from __future__ import annotations

import json
from typing import Any

from ..conf import settings
from ..management.terminal import ExactJSONEncoder

#: What a redacted value reads as: it says how to show it.
PLACEHOLDER = "[redacted: set PGBUS_WORKFLOWS['MCP_SHOW_PAYLOADS'] = True to show]"

#: The fields that may hold user data, or an error's message that may quote it.
REDACTED_FIELDS = frozenset(
    {
        "arguments",  # a run's
        "output",  # an attempt's
        "error_message",  # an attempt's error, which often quotes its arguments
        "traceback",  # an attempt's, with the values of the frames' lines
        "last_error",  # a schedule's, an error's message
        "payload",  # a signal's
        "details",  # an event's
        "reason",  # an event's: the engine writes an error's message there (step_failed, sweep_failed)
        "paused_reason",  # a run's: the error's message when it paused on one
    }
)


def json_ready(value: Any) -> Any:
    """``value`` as JSON reads it back: times in ISO 8601 to the microsecond, durations in ISO 8601, UUIDs as text."""
    return json.loads(json.dumps(value, cls=ExactJSONEncoder))


def redact(value: Any) -> Any:
    """``value``, each non-empty field of :data:`REDACTED_FIELDS` at any depth replaced by :data:`PLACEHOLDER`."""
    if isinstance(value, dict):
        return {key: _redact_field(key, item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


def _redact_field(key: str, value: Any) -> Any:
    if key in REDACTED_FIELDS and value not in (None, "", {}, []):
        return PLACEHOLDER
    return redact(value)


def response(result: dict[str, Any]) -> dict[str, Any]:
    """A tool's result as the client gets it: JSON-ready, redacted unless ``MCP_SHOW_PAYLOADS``."""
    ready: dict[str, Any] = json_ready(result)
    return ready if settings.MCP_SHOW_PAYLOADS else redact(ready)
