"""Who acts through the tools, and what they may see.

Without ``--as-user`` the server acts as the CLI's trusted system operator (whoever can start
``manage.py`` on the server is trusted as ``manage.py shell`` is): nothing is checked, and the
events record ``mcp:<client name>``, the name the MCP client gave in its ``clientInfo``
(``mcp:assistant`` when it gave none). With ``--as-user USERNAME`` every call acts as that
Django user, checked exactly as the CLI's ``--as-user`` checks them
(:meth:`~pgbus_workflows.operating.operators.Operator.as_user`), looked up again on each call
so a permission withdrawn, or a user deactivated, counts at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from ..operating.operators import Operator
from ..services.ledger import MAX_ACTOR_LENGTH

#: The actor's prefix: events written through the tools say so.
ACTOR_PREFIX = "mcp:"
#: The client's name when it gave none.
ANONYMOUS_CLIENT = "assistant"


def client_name(ctx: Context) -> str | None:
    """The name the MCP client gave in its ``clientInfo`` (the initialize request's, or the request's own)."""
    params = ctx.request_context.session.client_params
    return params.client_info.name if params is not None else None


def actor_for(client: str | None) -> str:
    """``mcp:<client>`` on one line, cut to what the events' ``actor`` column holds."""
    name = " ".join((client or "").split()) or ANONYMOUS_CLIENT
    return f"{ACTOR_PREFIX}{name}"[:MAX_ACTOR_LENGTH]


@dataclass(frozen=True)
class Acting:
    """How the server acts: as the MCP client (``as_user`` None), or as a Django user."""

    as_user: str | None = None

    def operator(self, client: str | None) -> Operator:
        """Who acts on this call; raises ``CommandError`` (a tool error) when ``as_user`` may not use the admin."""
        if self.as_user is not None:
            return Operator.as_user(self.as_user)
        return Operator.system(actor_for(client))


def viewing(operator: Operator) -> Operator:
    """``operator``, who must be allowed to view runs (the read tools ask it first)."""
    if not operator.may_view_runs():
        raise ToolError(f"{operator.who} may not view workflow runs")
    return operator
