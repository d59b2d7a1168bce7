"""The MCP server: the tools, their annotations, and the one path every call takes.

A tool body (:mod:`.reading`, :mod:`.writing`) is a plain function of the operator and its
arguments. :class:`BoundTool` is what the SDK registers: it shows the body's arguments to the
client, and on each call it

1. reads who acts (:class:`~.acting.Acting`, with the client's name from the request);
2. runs the body in Django's one thread for synchronous code (``sync_to_async``), dropping a
   database connection that broke or outlived ``CONN_MAX_AGE`` before and after, as Django
   does around each request;
3. turns the database being down or not migrated into a tool error of one line, as the CLI
   does, and a ``CommandError`` (``--as-user`` refused) into a tool error;
4. passes the result through :func:`~.responses.response`, which redacts payloads.

A tool error reaches the client as an ``isError`` result; an unexpected exception too (the SDK
logs it on stderr): the server goes on serving either way.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from asgiref.sync import sync_to_async
from django.core.management.base import CommandError
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from .. import __version__, migrated
from ..conf import settings
from . import reading, writing
from .acting import Acting, client_name
from .responses import response

#: A tool's body: the operator first, then the tool's arguments; its result, a dict for JSON.
ToolBody = Callable[..., dict[str, Any]]

#: The name the server gives in its ``serverInfo``.
SERVER_NAME = "pgbus-workflows"
#: What the client tells its model about the tools, before any call.
INSTRUCTIONS = """Durable workflow runs stored in PostgreSQL (pgbus_workflows): read them, and, when the
write tools are offered, operate them as an operator in the Django admin would. Find runs with
list_runs or stuck_runs, read one with show_run (its allowed_verbs say what it can take now),
a class's health with insights. Each write tool needs a reason: it is recorded on the run's audit
trail with who acted. Values shown as "[redacted: ...]" are hidden by the server's settings."""

#: A tool that reads only.
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
#: A verb that changes a run, and that another verb can undo or follow up.
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
#: A verb that gives up work for good: a cancelled run, a skipped step.
DESTROYS = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)

#: The tools always offered.
READ_TOOLS: tuple[ToolBody, ...] = (
    reading.list_runs,
    reading.show_run,
    reading.stuck_runs,
    reading.insights,
    reading.list_schedules,
)
#: The tools offered with ``MCP_WRITE_TOOLS``, each with its annotations.
WRITE_TOOLS: dict[ToolBody, ToolAnnotations] = {
    writing.pause_run: CHANGES,
    writing.resume_run: CHANGES,
    writing.resume_at: CHANGES,
    writing.run_now: CHANGES,
    writing.signal_run: CHANGES,
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
    """A tool body as the SDK calls it: the body's arguments, after the request's context, and one path per call.

    The SDK reads the tool's arguments from ``__signature__``: the body's, with its
    ``operator`` replaced by the request's context, which the SDK passes and the client never sees.
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
        self.__signature__ = inspect.Signature(parameters, return_annotation=dict[str, Any])
        self.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}

    async def __call__(self, ctx: Context, **arguments: Any) -> dict[str, Any]:
        """Answer one call: the body's result, JSON-ready and redacted, or a tool error."""
        return await sync_to_async(self.answer, thread_sensitive=True)(client_name(ctx), arguments)

    def answer(self, client: str | None, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run the body for ``client`` (the MCP client's name) with ``arguments``; Django's thread for sync code."""
        fresh_connections()
        try:
            with database_errors():
                return response(self.body(self.acting.operator(client), **arguments))
        except CommandError as error:
            raise ToolError(str(error)) from None
        finally:
            fresh_connections()  # and after it, as after a request: no connection idles past CONN_MAX_AGE


def add_tool(server: MCPServer, body: ToolBody, acting: Acting, annotations: ToolAnnotations) -> None:
    """Register ``body`` as the tool of its name, bound to ``acting``, its description its docstring."""
    tool = BoundTool(body, acting)
    server.add_tool(tool, name=tool.__name__, description=tool.__doc__, annotations=annotations)


def build_server(as_user: str | None = None) -> MCPServer:
    """The server: the read tools, and the write tools when ``MCP_WRITE_TOOLS`` is on; ``as_user`` acts if given."""
    acting = Acting(as_user)
    server: MCPServer = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS, version=__version__)
    for body in READ_TOOLS:
        add_tool(server, body, acting, READ_ONLY)
    if settings.MCP_WRITE_TOOLS:
        for body, annotations in WRITE_TOOLS.items():
            add_tool(server, body, acting, annotations)
    return server


def serve(as_user: str | None = None) -> None:
    """Serve the tools over stdio until the client closes the connection (stdout carries the protocol only)."""
    build_server(as_user).run("stdio")
