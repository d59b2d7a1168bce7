"""The MCP server: the tools, their annotations, and the one path every call takes.

The server is the SDK's low-level ``Server`` with two handlers, ``tools/list`` and
``tools/call``: it declares the ``tools`` capability and no other (no resources, no prompts,
which it has none of). A tool body (:mod:`.reading`, :mod:`.writing`) is a plain function of
the operator and its arguments. :class:`BoundTool` wraps it: the SDK's ``Tool`` reads the
body's arguments from it (the schema the client sees, and their validation), and on each call it

1. reads who acts (:class:`~.acting.Acting`, with the client's name from the request);
2. runs the body in Django's one thread for synchronous code (``sync_to_async``), dropping a
   database connection that broke or outlived ``CONN_MAX_AGE`` before and after, as Django
   does around each request;
3. turns the database being down or not migrated into a tool error of one line, as the CLI
   does, and a ``CommandError`` (``--as-user`` refused) into a tool error;
4. passes the result through :func:`~.responses.response`, which redacts payloads, and
   :func:`~.fitting.fitted`, which sends it once, as JSON text, within ``MCP_MAX_RESPONSE_BYTES``.

A tool error reaches the client as an ``isError`` result; an unexpected exception too (logged
on stderr): the server goes on serving either way.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from asgiref.sync import sync_to_async
from django.core.management.base import CommandError
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.stdio import stdio_server
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    ToolAnnotations,
)
from mcp.types import Tool as ListedTool

from .. import __version__, migrated
from ..conf import settings
from ..models.reading import reading as read_database
from ..sql.replica import read_lag
from . import reading, writing
from .acting import Acting, client_name
from .fitting import fitted
from .responses import response

logger = logging.getLogger(__name__)

#: A tool's body: the operator first, then the tool's arguments; its result, a dict for JSON.
ToolBody = Callable[..., dict[str, Any]]

#: The name the server gives in its ``serverInfo``.
SERVER_NAME = "pgbus-workflows"
#: What the client tells its model about the tools, before any call.
INSTRUCTIONS = """Durable workflow runs stored in PostgreSQL (pgbus_workflows): read them, and, when the
write tools are offered, operate them as an operator in the Django admin would. Find runs with
list_runs or stuck_runs, read one with show_run (its allowed_verbs say what it can take now),
a class's performance with insights; health answers whether everything is OK, limits which
concurrency keys and rate limits are busy and what they hold back. Each write tool
needs a reason: it is recorded on the run's audit trail with who acted. Values shown as
"[redacted: ...]" are hidden by the server's settings."""

#: A tool that reads only.
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
#: A verb that changes a run, and that another verb can undo or follow up.
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
#: A verb that gives up work for good: a cancelled run, a skipped step.
DESTROYS = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)

#: The tools always offered.
READ_TOOLS: tuple[ToolBody, ...] = (
    reading.health,
    reading.list_runs,
    reading.show_run,
    reading.stuck_runs,
    reading.insights,
    reading.list_schedules,
    reading.limits,
)
#: The read tools that read ``READ_DATABASE`` (a replica), their answer saying where and how far behind
#: (``read_database``, when not the primary); ``health``, ``show_run`` and ``limits`` read the primary.
ON_READ_DATABASE = frozenset({reading.list_runs, reading.stuck_runs, reading.insights, reading.list_schedules})
#: The tools offered with ``MCP_WRITE_TOOLS``, each with its annotations.
WRITE_TOOLS: dict[ToolBody, ToolAnnotations] = {
    writing.pause_run: CHANGES,
    writing.resume_run: CHANGES,
    writing.resume_at: CHANGES,
    writing.run_now: CHANGES,
    writing.signal_run: CHANGES,
    writing.fork_run: CHANGES,
    writing.hold: CHANGES,
    writing.release: CHANGES,
    writing.skip_step: DESTROYS,
    writing.cancel_run: DESTROYS,
}


def fresh_connections() -> None:
    """Drop the database connections that broke or outlived ``CONN_MAX_AGE``, as Django does around a request.

    So a server that outlived a database restart serves again once the database is back.
    """
    for connection in connections.all(initialized_only=True):
        # A transaction open around the server (a test's) owns its connection: closing it
        # would break that transaction, not renew anything.
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


@contextmanager
def database_errors() -> Iterator[None]:
    """The database down, unreachable or not migrated: a tool error of one line, as the CLI says it."""
    try:
        yield
    except (OperationalError, InterfaceError) as error:
        text = str(error).strip()
        raise ToolError(f"Cannot use the database: {text.splitlines()[0] if text else type(error).__name__}") from error
    except DatabaseError as error:
        missing = migrated.explain(error)
        if missing is None:
            raise
        raise ToolError(str(missing)) from error


class BoundTool:
    """A tool body as the SDK's ``Tool`` calls it: the body's arguments, after the request's context.

    The SDK reads the tool's arguments from ``__signature__``: the body's, with its
    ``operator`` replaced by the request's context, which the server passes and the client never sees.
    """

    def __init__(self, body: ToolBody, acting: Acting) -> None:
        """Bind ``body`` to ``acting``, who acts on each call."""
        self.body = body
        self.acting = acting
        self.__name__ = body.__name__
        self.__doc__ = inspect.getdoc(body)
        hints = typing.get_type_hints(body, include_extras=True)
        _operator, *arguments = inspect.signature(body).parameters.values()
        parameters = [
            inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context),
            *(parameter.replace(annotation=hints[parameter.name]) for parameter in arguments),
        ]
        self.__signature__ = inspect.Signature(parameters, return_annotation=CallToolResult)
        self.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}

    async def __call__(self, ctx: Context, **arguments: Any) -> CallToolResult:
        """Answer one call: the body's result, redacted, as JSON text within ``MCP_MAX_RESPONSE_BYTES``."""
        answer = await sync_to_async(self.answer, thread_sensitive=True)(client_name(ctx), arguments)
        return fitted(answer, settings.MCP_MAX_RESPONSE_BYTES, ctx.request_context.request_id)

    def answer(self, client: str | None, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run the body for ``client`` (the MCP client's name) with ``arguments``; Django's thread for sync code."""
        fresh_connections()
        try:
            with database_errors():
                if self.body not in ON_READ_DATABASE:
                    return response(self.body(self.acting.operator(client), **arguments))
                with read_database() as alias:
                    answer, lag = response(self.body(self.acting.operator(client), **arguments)), read_lag(alias)
                return {**answer, "read_database": lag.as_dict()} if lag.elsewhere else answer
        except CommandError as error:
            raise ToolError(str(error)) from None
        finally:
            fresh_connections()  # and after it, as after a request: no connection idles past CONN_MAX_AGE


def error_result(message: str) -> CallToolResult:
    """A tool error as the client gets it: ``isError`` and the message."""
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


class Tools:
    """The tools a server offers, by name: what ``tools/list`` lists and ``tools/call`` calls."""

    def __init__(self) -> None:
        """No tool yet."""
        self.by_name: dict[str, Tool] = {}

    def add(self, body: ToolBody, acting: Acting, annotations: ToolAnnotations) -> None:
        """Offer ``body`` as the tool of its name, bound to ``acting``, its description its docstring."""
        bound = BoundTool(body, acting)
        tool = Tool.from_function(
            bound, name=bound.__name__, description=bound.__doc__, annotations=annotations, structured_output=False
        )
        self.by_name[tool.name] = tool

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        """Every tool, with its arguments' schema and its annotations (no output schema: the answer is JSON text)."""
        return ListToolsResult(
            tools=[
                ListedTool(
                    name=tool.name,
                    description=tool.description,
                    input_schema=tool.parameters,
                    annotations=tool.annotations,
                )
                for tool in self.by_name.values()
            ]
        )

    async def call_tool(self, ctx: ServerRequestContext[Any], params: CallToolRequestParams) -> CallToolResult:
        """Call one tool: its answer, or a tool error (an unknown tool, arguments out of bounds, a refusal)."""
        tool = self.by_name.get(params.name)
        if tool is None:
            return error_result(f"Unknown tool: {params.name}")
        try:
            result: CallToolResult = await tool.run(params.arguments or {}, Context(request_context=ctx))
        except UnexpectedToolError:
            logger.exception("Tool %r raised an unexpected exception", params.name)
            return error_result(f"Error executing tool {params.name}")
        except ToolError as error:
            return error_result(str(error))
        return result


def build_server(as_user: str | None = None) -> Server[Any]:
    """The server: the read tools, and the write tools when ``MCP_WRITE_TOOLS`` is on; ``as_user`` acts if given."""
    acting = Acting(as_user)
    tools = Tools()
    for body in READ_TOOLS:
        tools.add(body, acting, READ_ONLY)
    if settings.MCP_WRITE_TOOLS:
        for body, annotations in WRITE_TOOLS.items():
            tools.add(body, acting, annotations)
    return offering(tools)


def offering(tools: Tools) -> Server[Any]:
    """A server that offers ``tools`` and declares the ``tools`` capability, no other."""
    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=tools.list_tools,
        on_call_tool=tools.call_tool,
    )


def serve(as_user: str | None = None) -> None:
    """Serve the tools over stdio until the client closes the connection (stdout carries the protocol only)."""
    server = build_server(as_user)

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)
