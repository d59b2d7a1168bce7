"""What insights' rollup asks the server: the transactions open in this database, and whether they ended.

The rollup (``services.rollups``) counts an attempt once its hour is settled: once every
transaction that held a transaction id in this database at its checkpoint has ended, so an
outcome that commits late is still counted. A transaction holds the exclusive lock on its own
id (``pg_locks``) from its first write to its end, committed or not.
"""

from __future__ import annotations

from typing import Any

from .statements import builds


@builds("open_transactions_here")
def open_transactions_here(conn: Any) -> str:
    """The ids of the transactions open in this database but this session's (PostgreSQL)."""
    return (
        "SELECT l.transactionid::text::bigint FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted "
        "AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.pid <> pg_backend_pid()"
    )


@builds("transactions_still_open")
def transactions_still_open(conn: Any) -> str:
    """Whether any of the transactions whose ids are the placeholder (a bigint array) is still open (PostgreSQL)."""
    return (
        "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'transactionid' AND mode = 'ExclusiveLock' "
        "AND granted AND transactionid::text::bigint = ANY(%s))"
    )
