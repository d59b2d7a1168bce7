"""Every hand-written SQL statement of the app, by name, and the one way they are run.

The texts live in :mod:`.statements`: each is built on first use from the models' metadata
(table and column names quoted by the backend, status literals from the ``TextChoices``)
and cached per database alias and vendor. Call :func:`statement` for a text. Run them
through :func:`cursor` (Django's cursor) or :func:`pipeline` (several statements in one round
trip on PostgreSQL): both are Django cursors, so execute wrappers, ``assertNumQueries``,
``connection.queries`` and the debug toolbar see every statement.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections

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
    """A Django cursor whose statements are pipelined and prepared (PostgreSQL).

    Statements queue up and go to the server together: one round trip for all of them, or
    one more for each ``fetch`` in between. The cursor binds on the server (``%b`` binary
    placeholders work) and prepares each statement, so the server plans it once per
    connection. :func:`pipelined_cursor` makes another one in the same pipeline (two result
    sets in one round trip). Inside the caller's transaction; errors are Django's exceptions.
    """
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    with db.wrap_database_errors, db.connection.pipeline():
        first = pipelined_cursor()
        try:
            yield first
        finally:
            first.close()


class PreparedCursor(psycopg.Cursor[Any]):
    """A server-binding cursor that prepares every statement it runs (Django's wrapper passes no ``prepare``)."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        """Run ``query`` prepared (the server plans it once per connection)."""
        kwargs.setdefault("prepare", True)
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
