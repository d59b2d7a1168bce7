"""Operator tools for AI assistants: ``manage.py workflows_mcp`` serves them over MCP's stdio transport.

Needs the ``mcp`` extra (``pip install "pgbus-workflows[mcp]"``): every module here imports
the official MCP SDK.

- :mod:`.server` builds the SDK's low-level ``Server``, which offers tools and nothing else:
  the read tools always, the write tools only with ``PGBUS_WORKFLOWS["MCP_WRITE_TOOLS"]``;
  every call goes through one path (who acts, the database's errors as one line, the result
  made JSON-ready, redacted, and sent once as JSON text within ``MCP_MAX_RESPONSE_BYTES``).
- :mod:`.reading` and :mod:`.writing` are the tools' bodies: the CLI's reads
  (``operating.runs``, ``operating.schedules``) and the admin's verbs
  (``admin.operations.OPERATIONS`` through ``operating.operators``), so an assistant can do
  nothing an operator at a terminal could not.
- :mod:`.arguments` caps and checks what the tools take; :mod:`.acting` says who acts;
  :mod:`.responses` redacts payloads unless ``PGBUS_WORKFLOWS["MCP_SHOW_PAYLOADS"]``;
  :mod:`.fitting` cuts an answer's largest values to fit ``MCP_MAX_RESPONSE_BYTES``.
"""

from __future__ import annotations

from .server import build_server, serve

__all__ = ["build_server", "serve"]
