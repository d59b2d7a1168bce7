"""Calling the tools as an MCP client does: the SDK's own in-process client against ``build_server()``.

The client, the server and its tools run in this test's thread's event loop (``async_to_sync``),
and the tools' database work runs in this thread (``sync_to_async``'s thread-sensitive mode), so
they see the test's transaction. Results are the SDK's ``CallToolResult``s, as a client reads them:
an answer is the JSON of the one text block.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import async_to_sync
from mcp.client import Client
from mcp.server.lowlevel import Server
from mcp.types import CallToolResult, Implementation, Tool

from pgbus_workflows.mcp import build_server

#: The name the tests' client gives in its clientInfo: the actor is mcp:<this>.
CLIENT = "claude-test"


async def _session(server: Server[Any], calls: list[tuple[str, dict[str, Any]]], client: str) -> list[CallToolResult]:
    async with Client(server, client_info=Implementation(name=client, version="1.0")) as session:
        return [await session.call_tool(name, arguments) for name, arguments in calls]


def call_all(
    calls: list[tuple[str, dict[str, Any]]],
    *,
    as_user: str | None = None,
    client: str = CLIENT,
    server: Server[Any] | None = None,
) -> list[CallToolResult]:
    """Make ``calls`` in turn in one session with a fresh server (or ``server``); their results, in order."""
    return async_to_sync(_session)(server or build_server(as_user), calls, client)


def call(name: str, arguments: dict[str, Any] | None = None, **options: Any) -> CallToolResult:
    """One call in a session of its own."""
    return call_all([(name, arguments or {})], **options)[0]


def text(result: CallToolResult) -> str:
    """The result's text content (a tool error's message, or the JSON of an answer)."""
    return "".join(block.text for block in result.content if block.type == "text")


def answered(result: CallToolResult) -> dict[str, Any]:
    """The answer of a call that succeeded: the JSON of its one text block, sent once."""
    assert not result.is_error, text(result)
    assert result.structured_content is None
    [block] = result.content
    assert block.type == "text"
    found: dict[str, Any] = json.loads(block.text)
    return found


def answer(name: str, arguments: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """The answer of a call that must succeed."""
    return answered(call(name, arguments, **options))


def tool_error(name: str, arguments: dict[str, Any] | None = None, **options: Any) -> str:
    """The message of a call that must be a tool error."""
    result = call(name, arguments, **options)
    assert result.is_error, text(result)
    return text(result)


async def _tools(server: Server[Any]) -> list[Tool]:
    async with Client(server) as session:
        return (await session.list_tools()).tools


def listed_tools(server: Server[Any] | None = None) -> dict[str, Tool]:
    """The tools a client is offered, by name."""
    return {tool.name: tool for tool in async_to_sync(_tools)(server or build_server())}
