"""Connections of the dispatcher's own, beside Django's: the LISTEN connection, the sweep and schedule locks.

Both must be right behind a connection pool in transaction mode (PgBouncer's
``pool_mode = transaction``), where consecutive transactions of one client may run on
different server connections:

- The sweep lock is a *transaction-level* advisory lock (``pg_try_advisory_xact_lock``),
  held by an open transaction on a connection of its own while the sweep runs. The pool keeps
  that transaction on one server connection and ends it when the client goes: the lock can
  never be left behind on a pooled server connection, as a session-level lock could.
- LISTEN needs a session. :func:`probe_listen` checks that the connection really receives what is
  sent to it (a probe NOTIFY to itself); through a transaction-mode pool it does not, and
  the dispatcher says so once and relies on its ``POLL_INTERVAL`` poll.
- Only a LISTEN connection that passed the probe, a session of its own, holds its
  dispatcher's *liveness lock* (:func:`hold_liveness_lock`, session-level): the server frees it
  when the session ends, as it does when the process is killed, so :func:`liveness_lock_free`
  tells a dead dispatcher long before its heartbeat is ``DISPATCHER_DEAD_AFTER`` old.
"""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from typing import Any

import psycopg
from django.db import connection

from ..sql import statement

logger = logging.getLogger("pgbus_workflows")

#: How long the LISTEN probe waits for its own notification.
PROBE_SECONDS = 2.0
#: The first key of every dispatcher's liveness lock ("pgwd"); the second is its name's.
LIVENESS_NAMESPACE = 0x70677764


def connection_params() -> dict[str, Any]:
    """psycopg connection parameters for the default database, from Django's settings."""
    params = connection.get_connection_params()
    keep = ("dbname", "user", "password", "host", "port", "sslmode", "sslrootcert", "sslcert", "sslkey", "options")
    return {k: v for k, v in params.items() if k in keep and v not in (None, "")}


class TransactionLock:
    """A transaction-level advisory lock on ``key``, on a connection of its own.

    ``acquire()`` returns False at once when another holds it; ``release()`` ends the
    transaction (and the connection), which releases the lock.
    """

    def __init__(self, key: int) -> None:
        self.key = key
        self._conn: Any = None

    def acquire(self) -> bool:
        """Take the lock, or return False when another session holds it."""

        conn = psycopg.connect(**connection_params())
        try:
            row = conn.execute(statement("advisory_xact_lock"), [self.key]).fetchone()
        except BaseException:
            conn.close()
            raise
        if not (row and row[0]):
            conn.close()
            return False
        self._conn = conn
        return True

    def held(self) -> bool:
        """Whether the lock is still held: its connection still answers (a lost connection lost the lock)."""
        if self._conn is None:
            return False
        try:
            self._conn.execute(statement("database_clock")).fetchone()
        except psycopg.Error:
            conn, self._conn = self._conn, None
            conn.close()  # the server ended the transaction, or will when it sees the connection go
            return False
        return True

    def release(self) -> None:
        """Roll the transaction back (releasing the lock) and close the connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.rollback()  # the lock is free when this returns (a close frees it a moment later)
            finally:
                conn.close()


def probe_listen(conn: Any, channel: str) -> bool:
    """Whether ``conn`` (after LISTEN on ``channel``) receives a notification sent to it.

    Through a transaction-mode pool the LISTEN stays on a server connection the client no
    longer holds, and the probe never comes back. The probe is sent from a connection of its
    own to the same endpoint: sent from ``conn``, it could run on the very server connection
    that ran the LISTEN (the pool's only idle one) and come back while ``conn`` holds it, a
    session proved by chance.
    """
    probe = f"probe:{uuid.uuid4().hex}"
    with psycopg.connect(**{**connection_params(), **conn.info.get_parameters()}, autocommit=True) as sender:
        sender.execute(statement("notify"), [channel, probe])
    deadline = time.monotonic() + PROBE_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        for note in conn.notifies(timeout=left, stop_after=1):
            if note.payload == probe:
                return True
    return False


def liveness_key(name: str) -> int:
    """The second key of dispatcher ``name``'s liveness lock: its name's CRC-32 as a signed 32-bit integer.

    Two names of one key would make a dead dispatcher look alive while the other lives: its
    death is then told by its heartbeat's age alone, as without the lock.
    """
    return zlib.crc32(name.encode()) - 2**31


def hold_liveness_lock(conn: Any, name: str) -> bool:
    """Take dispatcher ``name``'s liveness lock for the life of ``conn``'s session; False when another holds it."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", [LIVENESS_NAMESPACE, liveness_key(name)]).fetchone()
    return bool(row and row[0])


def liveness_lock_free(name: str) -> bool:
    """Whether no session holds dispatcher ``name``'s liveness lock (tried, and let go at once, on Django's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LIVENESS_NAMESPACE, liveness_key(name)])
        row = cursor.fetchone()
    return bool(row and row[0])
