"""A tool's answer as it goes on the wire: its JSON once, as text, cut to fit ``MCP_MAX_RESPONSE_BYTES``.

Once: the answer is the text block's JSON and nothing else. The MCP specification says a tool
that returns ``structuredContent`` SHOULD also return the same JSON serialized in a
``TextContent`` block, for clients that read only text (tools, "Structured Content", revisions
2025-06-18 and 2025-11-25); a structured answer is then sent twice. The tools declare no
``outputSchema`` (an answer's shape varies with the tool and the run), so nothing is lost by
sending the JSON once in the text block, which every client reads.

Cut to fit: the whole JSON-RPC message, one line on stdio, stays within
``PGBUS_WORKFLOWS["MCP_MAX_RESPONSE_BYTES"]``. When the answer would not fit, its largest values
(a signal's payload, a run's arguments, an error's traceback) are replaced, largest first, by
a marker that says how many bytes were cut, until it fits; the rows and their fields stay. An
answer that does not fit even so is a tool error asking for fewer rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, RequestId, TextContent

#: What the JSON-RPC message adds around a result, besides the request's id: ``jsonrpc``, the
#: ``id`` and ``result`` keys, and the ``resultType`` and ``_meta`` (the server's name and
#: version) the SDK adds for clients of the 2026 protocol.
ENVELOPE_BYTES = 512
#: Values are cut from this depth: a row's fields (a run's arguments, a signal's payload), never
#: an answer's own lists of rows.
CUT_FROM_DEPTH = 2
_SEPARATORS = (",", ":")


def cut_marker(size: int) -> str:
    """What a value cut to fit reads as: how big it was, and how to see it."""
    return f"[cut to fit PGBUS_WORKFLOWS['MCP_MAX_RESPONSE_BYTES']: {size} bytes of JSON; ask for fewer rows to see it]"


def dumps(value: Any) -> str:
    """``value`` as compact JSON, non-ASCII characters as they are."""
    return json.dumps(value, ensure_ascii=False, separators=_SEPARATORS)


def in_text(value: Any) -> int:
    """The bytes ``value``'s JSON takes in the text block, escaped on the wire (each ``"`` and ``\\`` doubled)."""
    text = dumps(value)
    return len(text.encode()) + text.count('"') + text.count("\\")


def text_result(answer: dict[str, Any]) -> CallToolResult:
    """The tool result that carries ``answer``'s JSON, once, in one text block."""
    return CallToolResult(content=[TextContent(type="text", text=dumps(answer))])


def wire_size(result: CallToolResult, request_id: RequestId | None) -> int:
    """The bytes of the JSON-RPC message that answers request ``request_id`` with ``result``."""
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode()) + ENVELOPE_BYTES + in_text(request_id)


def fitted(answer: dict[str, Any], max_bytes: int, request_id: RequestId | None = None) -> CallToolResult:
    """``answer`` as a tool result of at most ``max_bytes`` on the wire, its largest values cut if it must."""
    result = text_result(answer)
    over = wire_size(result, request_id) - max_bytes
    if over <= 0:
        return result
    result = text_result(cut_largest(answer, over))
    size = wire_size(result, request_id)
    if size > max_bytes:
        raise ToolError(
            f"The answer takes {size} bytes even with its values cut, more than "
            f"PGBUS_WORKFLOWS['MCP_MAX_RESPONSE_BYTES'] ({max_bytes}): ask for fewer rows"
        )
    return result


def cut_largest(answer: dict[str, Any], over: int) -> dict[str, Any]:
    """``answer``, its largest values replaced by :func:`cut_marker`, largest first, until ``over`` bytes are saved."""
    cut: dict[tuple[Any, ...], int] = {}
    saved = 0
    for size, path in sorted(_values(answer, ()), key=lambda found: found[0], reverse=True):
        if saved >= over:
            break
        if any(path[:depth] in cut for depth in range(CUT_FROM_DEPTH, len(path))):
            continue  # inside a value already cut
        gain = size - in_text(cut_marker(size))
        if gain <= 0:
            break  # this value and every smaller one are shorter than the marker
        cut[path] = size
        saved += gain
    cut_answer: dict[str, Any] = _replaced(answer, (), cut)
    return cut_answer


def _values(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """``(bytes in the text, path)`` of each field at :data:`CUT_FROM_DEPTH` or deeper."""
    if len(path) >= CUT_FROM_DEPTH and isinstance(path[-1], str):
        yield in_text(value), path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _values(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _values(item, (*path, index))


def _replaced(value: Any, path: tuple[Any, ...], cut: dict[tuple[Any, ...], int]) -> Any:
    if path in cut:
        return cut_marker(cut[path])
    if isinstance(value, dict):
        return {key: _replaced(item, (*path, key), cut) for key, item in value.items()}
    if isinstance(value, list):
        return [_replaced(item, (*path, index), cut) for index, item in enumerate(value)]
    return value
