"""How far the read database (``READ_DATABASE``) is behind the primary, as the pages that read it show.

A streaming replica's lag is read on the replica: ``now()`` less the commit time of the last
transaction it replayed (``pg_last_xact_replay_timestamp()``), or 0 when it has replayed all
the write-ahead log it received (an idle primary sends nothing, and a caught-up replica is not
behind, however old its last transaction). The lag is 0 when the read alias is the primary
itself, or a server that is not in recovery (a test's mirror, a primary named twice); it is
unknown (None) on a standby that has replayed no transaction since it started. A replica whose
WAL receiver is disconnected reports 0 once it has replayed what it received: PostgreSQL knows
no more on the standby.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from .statements import builds


@builds("replica_lag")
def replica_lag(conn: Any) -> str:
    """Whether the server is a standby, and its replay lag in seconds (None before a first replay)."""
    return (
        "SELECT pg_is_in_recovery(), CASE WHEN NOT pg_is_in_recovery() THEN 0 "
        "WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 "
        "ELSE GREATEST(EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8, 0) END"
    )


@dataclass(frozen=True)
class ReadLag:
    """Where a page's rows were read (``alias``) and how many seconds behind the primary that was."""

    #: The ``DATABASES`` alias read.
    alias: str
    #: Whether the alias is a server in recovery (a standby).
    standby: bool
    #: Seconds behind the primary: 0 for the primary itself, None when a standby cannot tell yet.
    seconds: float | None

    @property
    def elsewhere(self) -> bool:
        """Whether the rows were read from another alias than the primary's (the pages then say so)."""
        return self.alias != DEFAULT_DB_ALIAS

    def sentence(self) -> str:
        """Where the rows were read and how far behind, for a page: "read from 'replica', 2.5 s behind the primary"."""
        if self.seconds is None:
            behind = "lag unknown: no transaction replayed yet"
        elif self.seconds == 0:
            behind = "not behind the primary"
        else:
            behind = f"{self.seconds:.1f} s behind the primary"
        return f"read from {self.alias!r}, {behind}"

    def as_dict(self) -> dict[str, Any]:
        """``{"database", "standby", "lag_seconds"}``, JSON-ready (the MCP read tools' answers carry it)."""
        return {"database": self.alias, "standby": self.standby, "lag_seconds": self.seconds}


def read_lag(alias: str) -> ReadLag:
    """The lag of ``alias`` behind the primary (one statement on ``alias``; none for the primary itself)."""
    if alias == DEFAULT_DB_ALIAS or connections[alias].vendor != "postgresql":
        return ReadLag(alias, standby=False, seconds=0.0)
    with connections[alias].cursor() as django_cursor:
        django_cursor.execute(replica_lag(connections[alias]))
        standby, seconds = django_cursor.fetchone()
    return ReadLag(alias, standby=bool(standby), seconds=None if seconds is None else float(seconds))
