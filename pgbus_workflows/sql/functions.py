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
connection learns that it exists in its Nth start's own statement (``to_regproc``, no round
trip of its own), and calls it from then on: its first call in a session compiles it (about
1 ms), which a connection that makes a start or two and closes (``CONN_MAX_AGE`` 0) never pays.
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
from .statements import builds, start_run_rows, start_run_types

logger = logging.getLogger("pgbus_workflows")

#: Every start function's name begins so (``migrate pgbus_workflows zero`` drops them by it).
PREFIX = "pgbus_wf_start_run_"
#: The start of a connection from which it calls the function (psycopg's own ``prepare_threshold``).
THRESHOLD = 5
#: How long a connection that did not find the function waits before it looks again (a migrate may add it).
RECHECK_SECONDS = 60.0


@builds("start_function")
def start_function(conn: Any) -> str:
    """``CREATE OR REPLACE FUNCTION`` of ``start()``'s function (PostgreSQL); its name is :func:`function_name`.

    Its arguments are the statement's placeholders, then the ``NOTIFY`` channel and payload;
    it returns the new run's and attempt's keys, and no row (nothing written, no ``NOTIFY``)
    when a unique index refuses the run.
    """
    return _definition(conn).replace("{name}", function_name(conn))


def function_name(conn: Any) -> str:
    """The function's name: :data:`PREFIX` and a digest of its definition (the tables' columns, their types)."""
    name = _names.get(conn.alias)
    if name is None:
        name = _names[conn.alias] = PREFIX + hashlib.sha256(_definition(conn).encode()).hexdigest()[:16]
    return name


#: :func:`function_name` by database alias (the models do not change while a process runs).
_names: dict[str, str] = {}


def _definition(conn: Any) -> str:
    types = [*start_run_types(conn), "text", "text"]
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
def start_call(conn: Any) -> str:
    """The call of ``start()``'s function: the statement's parameters, then the ``NOTIFY``'s."""
    count = len(start_run_types(conn)) + 2
    return f"SELECT * FROM {function_name(conn)}({', '.join(['%s'] * count)})"


@dataclass
class _Path:
    """What one connection knows of the function: its starts so far, whether it found it, when it looked."""

    starts: int = 0
    found: bool = False
    looked_at: float | None = None


_paths: weakref.WeakKeyDictionary[Any, _Path] = weakref.WeakKeyDictionary()


def start_path(raw_connection: Any) -> tuple[str, bool]:
    """How this connection's next start runs: ``("call", False)``, ``("statement", probe)``.

    ``probe``: the statement asks whether the function exists (:func:`found`'s answer is
    its last column).
    """
    path = _paths.get(raw_connection)
    if path is None:
        path = _paths[raw_connection] = _Path()
    path.starts += 1
    if path.found:
        return "call", False
    if path.starts < THRESHOLD:
        return "statement", False
    due = path.looked_at is None or time.monotonic() - path.looked_at >= RECHECK_SECONDS
    return "statement", due


def found(raw_connection: Any, exists: bool) -> None:
    """The answer of a probing statement: whether the function exists (the connection calls it from now on)."""
    path = _paths.setdefault(raw_connection, _Path())
    path.found, path.looked_at = exists, time.monotonic()


def forget(raw_connection: Any) -> None:
    """This connection calls the function no more until it finds it again (it was dropped under it)."""
    _paths.pop(raw_connection, None)


def install(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Create ``start()``'s function on database ``using`` unless it exists; drop every one when the tables are gone.

    The ``post_migrate`` receiver's work (PostgreSQL only). Returns whether it created it. A
    database that refuses it (a role that may not create functions, no PL/pgSQL) is logged,
    not raised: ``start()`` then keeps running its statement, and ``migrate`` succeeds.
    """
    conn = connections[using]
    if conn.vendor != "postgresql":
        return False
    try:
        with transaction.atomic(using=using), conn.cursor() as cursor:
            if WorkflowRun._meta.db_table not in conn.introspection.table_names(cursor):
                _drop_all(cursor)  # ``migrate pgbus_workflows zero``: nothing may call them now
                return False
            if installed_name(using) is not None:
                return False
            cursor.execute(start_function(conn))
    except DatabaseError as error:
        logger.warning(
            "Could not create start()'s function %s (%s): start() runs its statement instead, which the "
            "server plans on every call",
            function_name(conn),
            str(error).strip(),
        )
        return False
    return True


def _drop_all(cursor: Any) -> None:
    """Drop every start function of this schema (their tables are gone)."""
    cursor.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname LIKE %s "
        "AND p.pronamespace = current_schema()::regnamespace",
        [PREFIX.replace("_", r"\_") + "%"],
    )
    for (signature,) in cursor.fetchall():
        cursor.execute(f"DROP FUNCTION IF EXISTS {signature}")


def installed_name(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """The name of this code's start function where it exists on ``using`` (None: not installed, or not PostgreSQL)."""
    conn = connections[using]
    if conn.vendor != "postgresql":
        return None
    with conn.cursor() as cursor:
        cursor.execute("SELECT to_regproc(%s)::text", [function_name(conn)])
        row = cursor.fetchone()
    return None if row is None or row[0] is None else str(row[0])
