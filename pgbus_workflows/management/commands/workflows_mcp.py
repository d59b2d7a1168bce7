"""``manage.py workflows_mcp``: the operator tools for AI assistants, served over MCP's stdio transport.

An MCP client (Claude Desktop, an IDE, an agent) starts this command and talks to it over
its stdin and stdout; the tools are :mod:`pgbus_workflows.mcp`'s. Needs the ``mcp`` extra.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ...operating.operators import Operator

INSTALL = 'pip install "pgbus-workflows[mcp]"'
ACTING = """Without --as-user the tools act as a trusted system operator (whoever can start
manage.py on the server is trusted like `manage.py shell`), and events record mcp:<client name>.
With --as-user USERNAME, every call acts as that Django user, with their admin permissions
checked exactly as `manage.py workflows --as-user` checks them, and their username is the actor.
The write tools are offered only with PGBUS_WORKFLOWS["MCP_WRITE_TOOLS"] = True."""


class Command(BaseCommand):
    """Serve the read tools (and, when enabled, the operator verbs) over MCP's stdio transport."""

    help = "Serve workflow runs to an MCP client (an AI assistant) over stdio. " + " ".join(ACTING.split())

    def add_arguments(self, parser: CommandParser) -> None:
        """``--as-user``: act as a Django user, with their permissions."""
        parser.add_argument("--as-user", metavar="USERNAME", help="act as this Django user, with their permissions")

    def handle(self, *args: Any, **options: Any) -> None:
        """Check ``--as-user`` once, then serve until the client closes stdin."""
        try:
            # Here, not at the top: the package needs the optional SDK, and a missing SDK
            # must say how to install it rather than fail Django's loading of the command.
            from ... import mcp as tools
        except ModuleNotFoundError as error:
            if error.name != "mcp" and not (error.name or "").startswith("mcp."):
                raise
            raise CommandError(f"The MCP tools need the MCP SDK: {INSTALL}") from error
        if options["as_user"] is not None:
            self.check_user(options["as_user"])
        tools.serve(options["as_user"])

    def check_user(self, username: str) -> None:
        """Refuse to start for a user who does not exist or may not use the admin (each call checks again)."""
        try:
            Operator.as_user(username)
        except DatabaseError as error:
            text = str(error).strip()
            first = text.splitlines()[0] if text else type(error).__name__
            raise CommandError(f"Cannot check --as-user {username}: the database says {first}") from error
