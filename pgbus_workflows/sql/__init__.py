"""Every hand-written SQL statement of the app, by name, and the one way they are run.

The texts live in :mod:`.statements` and :mod:`.claiming`: each is built on first use from the models' metadata
(table and column names quoted by the backend, status literals from the ``TextChoices``)
and cached per database alias and vendor. Call :func:`statement` for a text. Run them
through :func:`cursor` (Django's cursor) or :func:`pipeline` (several statements in one round
trip on PostgreSQL): both are Django cursors, so execute wrappers, ``assertNumQueries``,
``connection.queries`` and the debug toolbar see every statement. :mod:`.counting` holds
the reads that count without a scan (bounded and estimated counts, the values of an
index's leading column), for the admin and the sweep's gauge.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections

from . import claiming  # noqa: F401  (registers the claims' statements)
from .statements import BUILDERS

_cache: dict[tuple[str, str, str, tuple[Hashable, ...]], str] = {}

Statement = tuple[str, list[Any]]


def statement(name: str, *variant: Hashable) -> str:
    """The text of statement ``name`` (``variant``: what shapes it, e.g. a model and its fields)."""
    db = connections[DEFAULT_DB_ALIAS]  # resolved once: each attribute read through the proxy costs a lookup
    key = (db.alias, db.vendor, name, variant)
    text = _cache.get(key)
    if text is None:
        text = _cache[key] = BUILDERS[name](db, *variant)
    return text


def postgresql() -> bool:
    """Whether the app's database is PostgreSQL: the one question of vendor the rest of the app asks.

    What only PostgreSQL has (row locks with ``SKIP LOCKED``, arrays, pipelines, ``NOTIFY``,
    advisory locks, the server's clock) is used there; on SQLite the same reads and writes
    go through the ORM, or are not needed (one process writes at a time).
    """
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


@contextmanager
def cursor() -> Iterator[Any]:
    """Django's cursor on the default connection (statements with client-side binding)."""
    with connection.cursor() as django_cursor:
        yield django_cursor


@contextmanager
def pipeline() -> Iterator[Any]:
    """A Django cursor whose statements are pipelined, and prepared where allowed (PostgreSQL).

    Statements queue up and go to the server together: one round trip for all of them, or
    one more for each ``fetch`` in between. The cursor binds on the server (``%b`` binary
    placeholders work) and, where :func:`prepare_statements` allows it, prepares each
    statement, so the server plans it once per connection. :func:`pipelined_cursor` makes
    another one in the same pipeline (two result sets in one round trip). Inside the
    caller's transaction; errors are Django's exceptions.
    """
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    with db.wrap_database_errors, db.connection.pipeline():
        first = pipelined_cursor()
        try:
            yield first
        finally:
            first.close()


#: The servers (host, port) where :class:`PreparedCursor` prepares (see :func:`prepare_statements`).
_prepared_at: set[tuple[str, int]] = set()
#: A ``prepare_threshold`` no statement reaches by repetition: only those that ask are prepared.
_ONLY_WHEN_ASKED = 2**31 - 1


def prepare_statements(conn: psycopg.Connection[Any]) -> None:
    """Let the app's pipelined statements be prepared (planned once per connection) on ``conn``'s server.

    Off until called, as Django leaves prepared statements off by default: a pooler in
    transaction mode (PgBouncer before 1.21) hands a client another server connection
    between transactions, where a statement prepared on the first does not exist. A
    dispatcher needs a session of its own anyway (for LISTEN): it calls this with its LISTEN
    connection once the probe received its notification there, unless the setting
    ``PREPARED_STATEMENTS`` is False; from then on, every connection of the process to the
    same host and port prepares. A ``prepare_threshold`` set in the database's ``OPTIONS``
    is kept (psycopg then also prepares by repetition).
    """
    _prepared_at.add(_endpoint(conn))


def _endpoint(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    return conn.info.host, conn.info.port


class PreparedCursor(psycopg.Cursor[Any]):
    """A server-binding cursor that prepares its statements where :func:`prepare_statements` allows it."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        """Run ``query``, prepared where allowed (Django's wrapper passes no ``prepare``)."""
        if _prepared_at and _endpoint(self._conn) in _prepared_at:
            kwargs.setdefault("prepare", True)
            if self._conn.prepare_threshold is None:  # Django's default: nothing is ever prepared
                self._conn.prepare_threshold = _ONLY_WHEN_ASKED
        return super().execute(query, params, **kwargs)


def pipelined_cursor() -> Any:
    """Another prepared, server-binding Django cursor on the connection (in its pipeline, if any)."""
    db = connections[DEFAULT_DB_ALIAS]
    prepared: Any = PreparedCursor(db.connection)  # the stubs want a wrapper: Django wraps a DB-API cursor
    # Django's own wrapper around it: execute wrappers, query logging and counting see it.
    return db.make_debug_cursor(prepared) if db.queries_logged else db.make_cursor(prepared)


def run_batch(statements: list[Statement]) -> None:
    """Run statements that return nothing, in one round trip where the database allows it.

    On PostgreSQL, Django's client-side binding cursor sends them as one simple query; with
    ``OPTIONS={"server_side_binding": True}`` (where one query may hold one statement) they
    go in a pipeline instead, still one round trip.
    """
    if not statements:
        return
    on_postgresql = postgresql()
    if on_postgresql and len(statements) > 1 and _server_side_binding():
        with pipeline() as queued:
            for text, params in statements:
                queued.execute(text, params)
        return
    with cursor() as plain:
        if on_postgresql and len(statements) > 1:
            plain.execute("; ".join(text for text, _ in statements), [p for _, params in statements for p in params])
        else:
            for text, params in statements:
                plain.execute(text, params)


def _server_side_binding() -> bool:
    return bool(connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"))
