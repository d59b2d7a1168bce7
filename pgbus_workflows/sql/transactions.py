"""The statements ``services.transactions.commit_once`` sends.

The question of its transaction's id goes with the work's first pipeline; the two others ask,
on another connection, what became of a transaction whose COMMIT's answer was lost.
"""

from __future__ import annotations

from typing import Any

from .holding import held_pairs
from .statements import INDEX_PLANS, builds


@builds("transaction_id")
def transaction_id(conn: Any, on_indexes: bool = False) -> str:
    """This transaction's id, this session's backend pid and the holds in force (PostgreSQL).

    The holds ride along because an outcome batch that chains its next steps must know them
    (``services.ledger``), and this row costs no round trip of its own; reading them is one
    descent of the active holds' partial index, empty when nothing is held. ``on_indexes``:
    the rest of the transaction is planned as a claim is (:data:`.statements.INDEX_PLANS`).
    """
    asked = f"SELECT pg_current_xact_id()::text, pg_backend_pid(), {held_pairs(conn)}"
    return asked + (f", {INDEX_PLANS}" if on_indexes else "")


@builds("transaction_status")
def transaction_status(conn: Any) -> str:
    """Whether a transaction committed, aborted or is in progress (PostgreSQL)."""
    return "SELECT pg_xact_status(%s::xid8)"


@builds("terminate_backend")
def terminate_backend(conn: Any) -> str:
    """End another session (PostgreSQL)."""
    return "SELECT pg_terminate_backend(%s)"
