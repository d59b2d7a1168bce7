"""Every hand-written SQL statement of the app, by name, and the one way they are run.

The texts live in :mod:`.statements`, :mod:`.claiming` and :mod:`.debouncing`: each is built
on first use from the models' metadata (table and column names quoted by the backend, status
literals from the ``TextChoices``) and cached per database alias and vendor. Call
:func:`statement` for a text. Run them through :func:`cursor` (Django's cursor) or
:func:`pipeline` (several statements in one round trip on PostgreSQL): both are Django
cursors, so execute wrappers, ``assertNumQueries``, ``connection.queries`` and the debug
toolbar see every statement. :mod:`.counting` holds the reads that count without a scan
(bounded and estimated counts, the values of an index's leading column), for the admin and
the sweep's gauge.
"""

from __future__ import annotations

import itertools
import re
import threading
import weakref
from collections.abc import Hashable, Iterator, Mapping
from contextlib import closing, contextmanager
from typing import Any

import psycopg
from django.conf import settings as django_settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from psycopg import postgres
from psycopg.abc import Loader
from psycopg.adapt import PyFormat

from . import (  # noqa: F401  (register their statements)
    claiming,
    debouncing,
    fairness,
    limiting,
    replica,
    rollups,
    transactions,
)
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
def cursor(using: str | None = None) -> Iterator[Any]:
    """Django's cursor on the default connection, or ``using``'s (statements with client-side binding)."""
    with (connection if using is None else connections[using]).cursor() as django_cursor:
        yield django_cursor


@contextmanager
def uncompiled(using: str) -> Iterator[None]:
    """A transaction on ``using`` whose statements are never JIT-compiled (PostgreSQL; a plain one elsewhere).

    For the operator's reads of many rows (insights' attempts at a window's edge): their
    estimates pass ``jit_above_cost``, and compiling one took 190 ms where reading its 80,000
    attempts took 160 ms. Allowed on a replica too. Inside a caller's transaction (a savepoint
    then), the setting lasts until that transaction ends.
    """
    with transaction.atomic(using=using):
        if connections[using].vendor == "postgresql":
            with connections[using].cursor() as django_cursor:
                django_cursor.execute("SELECT set_config('jit', 'off', true)")
        yield


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
    lead, _lead.pending = getattr(_lead, "pending", None), None
    with db.wrap_database_errors, db.connection.pipeline():
        if lead is not None:
            lead.send()
        first = pipelined_cursor()
        try:
            yield first
        finally:
            first.close()


class Lead:
    """A statement of one row that goes with the next :func:`pipeline` of this thread: no round trip of its own.

    :func:`lead_with` makes one; :meth:`row` reads its row once the pipeline that took it
    has synced, or sends it then when no pipeline did.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self._cursor: Any = None
        self._row: tuple[Any, ...] | None = None

    def send(self) -> None:
        """Queue it (inside a pipeline)."""
        self._cursor = pipelined_cursor()
        self._cursor.execute(self.text)

    def row(self) -> tuple[Any, ...]:
        """Its row: from the pipeline that took it, or sent now (one round trip) if none did; read once."""
        if self._row is not None:
            return self._row
        if _lead.pending is self:
            _lead.pending = None
            with pipeline():
                self.send()
        try:
            self._row = tuple(self._cursor.fetchone())
        finally:
            self._cursor.close()
        return self._row

    def drop(self) -> None:
        """Not to be sent after all (the work ended before a pipeline took it)."""
        if getattr(_lead, "pending", None) is self:
            _lead.pending = None


#: The statement the next pipeline of each thread leads with (``pending``), if any.
_lead = threading.local()


def lead_with(text: str) -> Lead:
    """Have the next :func:`pipeline` of this thread send ``text`` first, in its round trip."""
    lead = _lead.pending = Lead(text)
    return lead


@contextmanager
def bound_cursor(*, timestamps: bool = True) -> Iterator[Any]:
    """A Django cursor that binds on the server (:class:`PreparedCursor`), for one statement outside a pipeline.

    For a statement of many parameters (``start()``'s): its text is parsed once per process,
    where a client-binding cursor would spell every value into it and psycopg parse it
    again on each call. The connection is checked as Django's ``cursor()`` checks it
    (``CONN_HEALTH_CHECKS``, the thread). ``timestamps=False``: its rows hold none, so
    psycopg's loader is not registered on it (:class:`PreparedCursor`).
    """
    db = connections[DEFAULT_DB_ALIAS]
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    with closing(pipelined_cursor(timestamps=timestamps)) as bound:
        yield bound


def fetch_in_index_order(text: str, params: list[Any] | Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Run one statement planned on indexes, as is every later one of its transaction; its rows.

    Only in a transaction of the caller's own: in autocommit (the statement is its
    transaction) or in an atomic block it opened. For the claims, which read the first due
    steps or jobs in the order of a partial index. When the planner expects few due rows
    (statistics from a table that was small, or from before a burst), it picks a bitmap
    scan of that index and a sort: it then reads every entry the vacuum has not removed yet,
    those of steps claimed since included, on every claim, as a bitmap scan never marks an
    entry dead (an ordered index scan marks those it finds dead and stops at the limit).
    ``bench.dead_entries`` measures both plans. Sequential scans are off too: a plan the
    connection made while the tables were small would read them whole on every claim as they
    grow (see ``services.transactions.commit_once``'s ``on_indexes``). The setting is the transaction's own
    (``set_config`` local), sent with the statement in one pipeline: one round trip, nothing
    left on the session. The connection is checked as :func:`bound_cursor` checks it.
    """
    db = connections[DEFAULT_DB_ALIAS]
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    with db.wrap_database_errors, closing(pipelined_cursor()) as setting, closing(pipelined_cursor()) as bound:
        with db.connection.pipeline():  # its exit syncs: one round trip (a fetch inside would sync once more)
            setting.execute(statement("index_order_scans"))
            bound.execute(text, params)
        return list(bound.fetchall())


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
    _preparing.clear()  # connections asked before are asked again


def _endpoint(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    return conn.info.host, conn.info.port


class PreparedCursor(psycopg.RawCursor[Any]):
    """A server-binding cursor for the app's statements: placeholders numbered once, arrays in binary.

    It prepares its statements where :func:`prepare_statements` allows it. The statements are
    written with psycopg's ``%s``/``%b`` placeholders, or its named ``%(name)s`` ones with a
    mapping; :func:`numbered` turns each text into
    PostgreSQL's ``$1, $2, ...`` once, so psycopg parses nothing per call (its own cache of
    converted queries leaves out any with more than 50 parameters, as a batch of rows has).
    Every parameter then takes its type's automatic format, and lists the binary one (a
    text array costs psycopg about three times the CPU), as ``%b`` asked. With ``USE_TZ``,
    timestamps are read by psycopg's own loader (compiled, 0.3 µs each) rather than Django's
    (psycopg's pure-Python one, then the zone set again: 4.4 µs), which would make them the
    same aware datetimes in the connection's time zone, which Django set the session to: a
    claim and the outcome's locks read about fourteen of them a step.
    """

    def __init__(self, connection: psycopg.Connection[Any], *, timestamps: bool = True) -> None:
        """``timestamps=False``: for statements whose rows hold none (the loader costs 1.5 µs a cursor)."""
        super().__init__(connection)
        self.adapters.register_dumper(list, _BINARY_LIST)
        if timestamps and django_settings.USE_TZ:
            self.adapters.register_loader(_TIMESTAMPTZ_OID, _TIMESTAMPTZ)  # by number: no lookup per cursor

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        """Run ``query``, prepared where allowed (Django's wrapper passes no ``prepare``)."""
        if prepares(self._conn):
            kwargs.setdefault("prepare", True)
        text, names = _numbering(query)
        if names:
            params = in_order(names, params)
        return super().execute(text, params, **kwargs)

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
        """Run ``query`` once per parameter set (numbered as :meth:`execute`)."""
        super().executemany(numbered(query), params_seq, **kwargs)


_BINARY_LIST = psycopg.adapters.get_dumper(list, PyFormat.BINARY)


def _psycopg_loader(oid: int) -> type[Loader]:
    """psycopg's own loader of type ``oid``'s text (its C one where psycopg's binary package is installed)."""
    loader = psycopg.adapters.get_loader(oid, psycopg.pq.Format.TEXT)
    if loader is None:  # psycopg registers one for every built-in type
        raise LookupError(f"psycopg has no loader of type {oid}")
    return loader


_TIMESTAMPTZ_OID = postgres.types["timestamptz"].oid
_TIMESTAMPTZ = _psycopg_loader(_TIMESTAMPTZ_OID)

#: Whether :class:`PreparedCursor` prepares on a connection: asked once per connection.
_preparing: weakref.WeakKeyDictionary[psycopg.Connection[Any], bool] = weakref.WeakKeyDictionary()


def prepares(conn: psycopg.Connection[Any]) -> bool:
    """Whether the app's statements are prepared on this connection (see :func:`prepare_statements`)."""
    known = _preparing.get(conn)
    if known is None:
        known = _preparing[conn] = bool(_prepared_at) and _endpoint(conn) in _prepared_at
        if known and conn.prepare_threshold is None:  # Django's default: nothing is ever prepared
            conn.prepare_threshold = _ONLY_WHEN_ASKED
    return known


#: psycopg's placeholders, named ones included (and its escaped percent sign), in the app's statements.
_PLACEHOLDER = re.compile(r"%(\(\w+\)s|.)", re.DOTALL)
#: Each statement's numbered text and the names of its ``$1, $2, ...`` (empty: positional placeholders).
_numbered: dict[str, tuple[str, tuple[str, ...]]] = {}


def numbered(query: str) -> str:
    """``query`` with its ``%s``/``%b``/``%t`` or ``%(name)s`` placeholders as ``$1, $2, ...`` and ``%%`` as ``%``.

    A name used more than once is one parameter. Cached. Raises ``ValueError`` for any other
    ``%`` sequence, as psycopg would for its own placeholders, and for named and positional
    placeholders in one statement.
    """
    return _numbering(query)[0]


def _numbering(query: str) -> tuple[str, tuple[str, ...]]:
    """:func:`numbered`'s text and the names its parameters are bound in order (see :func:`in_order`)."""
    found = _numbered.get(query)
    if found is None:
        count = itertools.count(1)
        names: dict[str, str] = {}
        positional = False

        def number(match: re.Match[str]) -> str:
            nonlocal positional
            kind = match.group(1)
            if kind == "%":
                return "%"
            if kind.startswith("("):
                name = kind[1:-2]
                if name not in names:
                    names[name] = f"${next(count)}"
                return names[name]
            if kind not in "sbt":
                raise ValueError(f"only %s, %b, %t, %(name)s and %% may follow a % sign in a statement, got %{kind}")
            positional = True
            return f"${next(count)}"

        text = _PLACEHOLDER.sub(number, query)
        if positional and names:
            raise ValueError("a statement takes named placeholders or positional ones, not both")
        found = _numbered[query] = (text, tuple(names))
    return found


def in_order(names: tuple[str, ...], params: Mapping[str, Any]) -> list[Any]:
    """The values of a statement's named placeholders as a list, in the order :func:`numbered` numbered them.

    Raises ``KeyError`` naming a placeholder the mapping lacks.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"a statement of named placeholders takes a mapping, not {type(params).__name__}")
    try:
        return [params[name] for name in names]
    except KeyError as error:
        raise KeyError(f"no value for the statement's placeholder %({error.args[0]})s") from None


def pipelined_cursor(*, timestamps: bool = True) -> Any:
    """Another prepared, server-binding Django cursor on the connection (in its pipeline, if any)."""
    db = connections[DEFAULT_DB_ALIAS]
    # Any: the stubs want a wrapper where Django wraps a DB-API cursor.
    prepared: Any = PreparedCursor(db.connection, timestamps=timestamps)
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
