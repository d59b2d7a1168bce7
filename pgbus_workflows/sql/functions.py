"""``start()``'s statement as a PL/pgSQL function: planned once per server session, through any pool.

Django prepares nothing by default (a pool in transaction mode may run a client's next
transaction in another server session, where a statement prepared in the first does not
exist), so where the engine may not prepare (web processes: ``sql.prepare_statements``),
``start()``'s one statement was parsed and planned by the server on every call (a start cost
it 0.40 ms, the function's call 0.25 ms: measured back to back). A PL/pgSQL function's
statements are planned once per server session, whoever calls, with nothing kept by the
client: ``start()`` calls the function instead, and the server parses only the call.

The function is built from the same text as the statement (``statements.start_run_rows``) and
named after a digest of its definition, so a new column makes a new name: code calls only the
function that writes its own columns, and a rolling deploy's older code keeps calling its own
(functions of earlier definitions are left in place; ``migrate pgbus_workflows zero`` drops
them all). It is installed after every ``migrate`` (``post_migrate``, see ``apps``). A
connection learns that it exists in its Nth start's own statement (a probe of the catalog, no
round trip of its own), and calls it from then on: its first call in a session compiles it (about
1 ms), which a connection that makes a start or two and closes (``CONN_MAX_AGE`` 0) never pays.

It is trusted by its owner and its schema, never by its name alone: it is created in the
schema of the runs table (``pg_class``, not ``current_schema()``), owned by the runs table's
owner, and called schema-qualified with every argument cast to its type, so neither a schema
earlier on the search path (``"$user"`` comes first in the default one) nor an overload can
stand in for it. Any other function of the prefix is never called: whoever may create objects
in a schema (every role on ``public`` before PostgreSQL 15) could have planted it, and it
would run with the application's rights. :func:`install` and :func:`foreign` name them.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import weakref
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from ..models import WorkflowRun
from . import numbered
from .statements import builds, quote, start_run_rows, start_run_types

logger = logging.getLogger("pgbus_workflows")

#: Every start function's name begins so (``migrate pgbus_workflows zero`` drops them by it).
PREFIX = "pgbus_wf_start_run_"
#: The start of a connection from which it calls the function (psycopg's own ``prepare_threshold``).
THRESHOLD = 5
#: How long a connection that did not find the function waits before it looks again (a migrate may add it).
RECHECK_SECONDS = 60.0


@builds("start_function")
def start_function(conn: Any, qualified: str) -> str:
    """``CREATE OR REPLACE FUNCTION`` of ``start()``'s function as ``qualified`` (``schema.name``, quoted).

    Its arguments are the statement's placeholders, then the ``NOTIFY`` channel and payload;
    it returns the new run's and attempt's keys, and no row (nothing written, no ``NOTIFY``)
    when a unique index refuses the run.
    """
    return _definition(conn).replace("{name}", qualified)


def function_name(conn: Any) -> str:
    """The function's name: :data:`PREFIX` and a digest of its definition (the tables' columns, their types)."""
    name = _names.get(conn.alias)
    if name is None:
        name = _names[conn.alias] = PREFIX + hashlib.sha256(_definition(conn).encode()).hexdigest()[:16]
    return name


#: :func:`function_name` by database alias (the models do not change while a process runs).
_names: dict[str, str] = {}


def signature(conn: Any) -> str:
    """The function's name and argument types, as ``to_regprocedure`` reads them (without its schema)."""
    return f"{function_name(conn)}({', '.join(_types(conn))})"


def _types(conn: Any) -> list[str]:
    return [*start_run_types(conn), "text", "text"]


def probe_params(conn: Any) -> list[str]:
    """The parameters of the probe of ``start()``'s statement (``statements.start_run``): signature, runs table."""
    return [signature(conn), quote(conn, WorkflowRun._meta.db_table)]


def _definition(conn: Any) -> str:
    types = _types(conn)
    arguments = ", ".join(f"p{number} {kind}" for number, kind in enumerate(types, start=1))
    body = re.sub(r"\$(\d+)", r"p\1", numbered(start_run_rows(conn)))
    channel, payload = len(types) - 1, len(types)
    key = WorkflowRun._meta.pk.rel_db_type(conn)
    return (
        f"CREATE OR REPLACE FUNCTION {{name}}({arguments}) RETURNS TABLE (new_run {key}, new_step {key}) "
        "LANGUAGE plpgsql VOLATILE AS $pgbus$ BEGIN "
        f"RETURN QUERY {body} FROM r, s; "
        f"IF FOUND THEN PERFORM pg_notify(p{channel}, p{payload}); END IF; "
        "END $pgbus$"
    )


@builds("start_call")
def start_call(conn: Any, qualified: str) -> str:
    """The call of the function ``qualified`` (``schema.name``, as the probe found it).

    Its parameters: the statement's, then the ``NOTIFY``'s, each cast to its argument's type,
    so that no overload of the name in that schema can be chosen instead.
    """
    return f"SELECT * FROM {qualified}({', '.join(f'%s::{kind}' for kind in _types(conn))})"


@dataclass
class _Path:
    """What one connection knows of the function: its starts so far, the one it found (if any), when it looked."""

    starts: int = 0
    function: str | None = None
    looked_at: float | None = None


_paths: weakref.WeakKeyDictionary[Any, _Path] = weakref.WeakKeyDictionary()


def start_path(raw_connection: Any) -> tuple[str | None, bool]:
    """How this connection's next start runs: ``(function, False)`` calls it, ``(None, probe)`` runs the statement.

    ``function``: the schema-qualified name the probe found. ``probe``: the statement asks
    which function to call (:func:`found`'s answer is its last column).
    """
    path = _paths.get(raw_connection)
    if path is None:
        path = _paths[raw_connection] = _Path()
    path.starts += 1
    if path.function is not None:
        return path.function, False
    if path.starts < THRESHOLD:
        return None, False
    due = path.looked_at is None or time.monotonic() - path.looked_at >= RECHECK_SECONDS
    return None, due


def found(raw_connection: Any, function: str | None) -> None:
    """The answer of a probing statement: the trusted function's qualified name, called from now on (None: none)."""
    path = _paths.setdefault(raw_connection, _Path())
    path.function, path.looked_at = function, time.monotonic()


def forget(raw_connection: Any) -> None:
    """This connection calls the function no more until it finds it again (it was dropped under it)."""
    _paths.pop(raw_connection, None)


def install(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Create ``start()``'s function on database ``using`` unless it exists; drop every one when the tables are gone.

    The ``post_migrate`` receiver's work (PostgreSQL only). Returns whether it created it. It
    is created in the runs table's schema and, when ``migrate`` runs as another role, given to
    the runs table's owner (the only owner ``statements.start_run``'s probe trusts). A function
    of the prefix that another role owns is named in a warning and left alone: a planted one
    of this code's signature is neither replaced nor called. A database that refuses the
    function (a role that may not create functions, or may not give it to the tables' owner;
    no PL/pgSQL) is logged, not raised: ``start()`` then keeps running its statement, and
    ``migrate`` succeeds.
    """
    conn = connections[using]
    if conn.vendor != "postgresql":
        return False
    try:
        with transaction.atomic(using=using), conn.cursor() as cursor:
            tables = _tables(cursor, conn)
            if tables is None:
                _drop_all(cursor)  # ``migrate pgbus_workflows zero``: nothing may call them now
                return False
            schema, owner = tables
            present = _functions(cursor, conn)
            for function in present:
                if not function.owned:
                    _warn_foreign(function, owner)
            if any(function.this_code for function in present):
                return False  # ours; or a foreign one of its signature, which only its owner may replace
            qualified = f"{quote(conn, schema)}.{function_name(conn)}"
            cursor.execute(start_function(conn, qualified))
            # Trusted only as the tables' owner's: ``migrate`` may run as another role (a member of the
            # owner's), or have replaced, as a superuser, one planted since the look above. A no-op otherwise.
            cursor.execute(f"ALTER FUNCTION {qualified}({', '.join(_types(conn))}) OWNER TO {quote(conn, owner)}")
    except DatabaseError as error:
        logger.warning(
            "Could not create start()'s function %s (%s): start() runs its statement instead, which the "
            "server plans on every call",
            function_name(conn),
            str(error).strip(),
        )
        return False
    return True


@dataclass(frozen=True)
class Found:
    """A function whose name begins with :data:`PREFIX`, in any schema."""

    #: ``schema.name``, each quoted where it needs to be.
    name: str
    owner: str
    #: Owned by the runs table's owner (the only functions ``start()`` may call).
    owned: bool
    #: This code's function: its name and arguments, in the runs table's schema (owned or not).
    this_code: bool

    def __str__(self) -> str:
        return f"{self.name} (owner {self.owner})"


def _tables(cursor: Any, conn: Any) -> tuple[str, str] | None:
    """The runs table's schema and owner, the table as this connection's statements find it; None: no table."""
    cursor.execute(
        "SELECT n.nspname, pg_get_userbyid(c.relowner) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
        [quote(conn, WorkflowRun._meta.db_table)],
    )
    row = cursor.fetchone()
    return None if row is None else (str(row[0]), str(row[1]))


def _functions(cursor: Any, conn: Any) -> list[Found]:
    """Every function of the prefix in any schema (none when the runs table is missing)."""
    cursor.execute(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(p.proname), pg_get_userbyid(p.proowner), "
        "p.proowner = c.relowner, COALESCE(p.oid = to_regprocedure(quote_ident(t.nspname) || '.' || %s), false) "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "JOIN pg_class c ON c.oid = to_regclass(%s) JOIN pg_namespace t ON t.oid = c.relnamespace "
        "WHERE p.proname LIKE %s ORDER BY 1, 2",
        [*probe_params(conn), PREFIX.replace("_", r"\_") + "%"],
    )
    return [Found(str(name), str(owner), bool(owned), bool(ours)) for name, owner, owned, ours in cursor.fetchall()]


def _warn_foreign(function: Found, owner: str) -> None:
    logger.warning(
        "The function %s bears the name of start()'s functions, but the runs table's owner (%s) does not own "
        "it: start() never calls it. A role that may create objects in its schema could have planted it: drop it "
        "and revoke CREATE on that schema from PUBLIC.",
        function,
        owner,
    )


def foreign(using: str = DEFAULT_DB_ALIAS) -> list[Found]:
    """The functions of the prefix, in any schema, that the runs table's owner does not own (never called)."""
    conn = connections[using]
    if conn.vendor != "postgresql":
        return []
    with conn.cursor() as cursor:
        return [function for function in _functions(cursor, conn) if not function.owned]


def _drop_all(cursor: Any) -> None:
    """Drop every start function of this schema that this role may drop (their tables are gone)."""
    cursor.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname LIKE %s "
        "AND p.pronamespace = current_schema()::regnamespace AND pg_has_role(p.proowner, 'USAGE')",
        [PREFIX.replace("_", r"\_") + "%"],
    )
    for (signature,) in cursor.fetchall():
        cursor.execute(f"DROP FUNCTION IF EXISTS {signature}")


def installed_name(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """This code's start function, ``schema.name``, where it exists on ``using`` as ``start()`` would call it.

    In the runs table's schema, of this code's arguments, owned by the runs table's owner.
    None: not installed (or only a foreign one), or not PostgreSQL.
    """
    conn = connections[using]
    if conn.vendor != "postgresql":
        return None
    with conn.cursor() as cursor:
        trusted = [f.name for f in _functions(cursor, conn) if f.this_code and f.owned]
    return trusted[0] if trusted else None
