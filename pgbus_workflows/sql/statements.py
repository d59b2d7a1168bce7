"""The statements, by name: ``BUILDERS[name](connection, *variant)`` returns the text.

Names are quoted by the backend, status values come from the models' ``TextChoices`` (never
typed again here), values are parameters, arrays are cast to their element type without a
length. ``%b`` is a binary parameter (PostgreSQL, server-side binding: :func:`..pipeline`).
Kept free of logic: which statement runs when is the callers' business.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.db.models import Field, Model

from ..models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowStep
from ..states import StepStatus, job_event

Builder = Callable[..., str]
BUILDERS: dict[str, Builder] = {}


def builds(name: str) -> Callable[[Builder], Builder]:
    """Register the function as the builder of statement ``name``."""

    def register(function: Builder) -> Builder:
        BUILDERS[name] = function
        return function

    return register


# -- names and literals ------------------------------------------------------------------------------------


def quote(conn: Any, name: str | None) -> str:
    """``name`` quoted for the backend."""
    return str(conn.ops.quote_name(str(name)))


def table(conn: Any, model: type[Model]) -> str:
    """The quoted table of ``model``."""
    return quote(conn, model._meta.db_table)


def column(conn: Any, model: type[Model], name: str) -> str:
    """The quoted column of field ``name`` of ``model``."""
    return quote(conn, model._meta.get_field(name).column)  # type: ignore[union-attr]


def pk(conn: Any, model: type[Model]) -> str:
    """The quoted primary key column of ``model``."""
    return quote(conn, model._meta.pk.column if model._meta.pk else "id")


def columns(conn: Any, model: type[Model], prefix: str = "") -> str:
    """Every concrete column of ``model``, quoted, in field order (as ``rows.from_row`` reads them)."""
    return ", ".join(prefix + quote(conn, f.column) for f in model._meta.concrete_fields)


def literal(value: str) -> str:
    """A status value as an SQL literal (the values are plain lowercase words: checked)."""
    if not re.fullmatch(r"[a-z_]+", value):
        raise ValueError(f"not a status value: {value!r}")
    return f"'{value}'"


def array_of(conn: Any, field: Field[Any, Any]) -> str:
    """A binary array parameter cast to the element type of ``field``, without a length."""
    return f"%b::{_element_type(conn, field)}[]"


def scalar_of(conn: Any, field: Field[Any, Any]) -> str:
    """A binary parameter cast to the type of ``field``, without a length (the column checks it)."""
    return f"%b::{_element_type(conn, field)}"


def _element_type(conn: Any, field: Field[Any, Any]) -> str:
    return re.sub(r"\(\s*\d+(\s*,\s*\d+)?\s*\)", "", str(field.db_type(conn)))


# -- rows of any model (rows.py, bulk.py) ----------------------------------------------------------------


@builds("update")
def update(conn: Any, model: type[Model], names: tuple[str, ...]) -> str:
    """``UPDATE`` some columns of one row by key."""
    assignments = ", ".join(f"{column(conn, model, name)} = %s" for name in names)
    return f"UPDATE {table(conn, model)} SET {assignments} WHERE {pk(conn, model)} = %s"


@builds("insert")
def insert(conn: Any, model: type[Model], computed: tuple[tuple[str, str], ...]) -> str:
    """``INSERT`` one row, ``RETURNING`` its key and the ``computed`` ``(field, SQL expression)`` columns."""
    expressions = dict(computed)
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    names = ", ".join(quote(conn, f.column) for f in fields)
    values = ", ".join(expressions.get(f.name, "%s") for f in fields)
    returning = ", ".join([pk(conn, model), *(column(conn, model, name) for name, _ in computed)])
    return f"INSERT INTO {table(conn, model)} ({names}) VALUES ({values}) RETURNING {returning}"


@builds("insert_many")
def insert_many(conn: Any, model: type[Model], count: int, returning: tuple[str, ...], skip_conflicts: bool) -> str:
    """``INSERT`` ``count`` rows in one statement (placeholders per row: SQLite, and few rows).

    ``returning``: the fields to read back, in the rows' order; ``skip_conflicts``: a row a
    unique index refuses is left out (``ON CONFLICT DO NOTHING``) and returns nothing.
    """
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    names = ", ".join(quote(conn, f.column) for f in fields)
    text = f"INSERT INTO {table(conn, model)} ({names}) VALUES " + ", ".join([row] * count)
    return text + _insert_tail(conn, model, returning, skip_conflicts)


@builds("unnest_insert")
def unnest_insert(
    conn: Any, model: type[Model], returning: tuple[str, ...], skip_conflicts: bool, constant: tuple[str, ...]
) -> str:
    """``INSERT`` any number of rows from one array per column (PostgreSQL: one text for any count).

    A column of ``constant`` (attnames) has one value for every row: it is sent once, as one
    parameter, not as an array. Parameters: the constant columns' values, then the other
    columns' arrays, each in field order.
    """
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    names = ", ".join(quote(conn, f.column) for f in fields)
    varying = [f for f in fields if f.attname not in constant]
    values = ", ".join(scalar_of(conn, f) if f.attname in constant else f"v.c{fields.index(f)}" for f in fields)
    arrays = ", ".join(array_of(conn, f) for f in varying)
    aliases = ", ".join(f"c{fields.index(f)}" for f in varying)
    text = f"INSERT INTO {table(conn, model)} ({names}) SELECT {values} FROM unnest({arrays}) AS v({aliases})"
    return text + _insert_tail(conn, model, returning, skip_conflicts)


def _insert_tail(conn: Any, model: type[Model], returning: tuple[str, ...], skip_conflicts: bool) -> str:
    conflicts = " ON CONFLICT DO NOTHING" if skip_conflicts else ""
    if not returning:
        return conflicts
    return f"{conflicts} RETURNING {', '.join(column(conn, model, name) for name in returning)}"


@builds("unnest_update")
def unnest_update(conn: Any, model: type[Model], names: tuple[str, ...]) -> str:
    """``UPDATE`` any number of rows by key from one array per column (PostgreSQL).

    The rows are found by their keys (``= ANY``, an index condition on the primary key), not
    by the join alone: statistics taken while the table was nearly empty make a whole read of
    the primary key look as cheap as the few rows, and the planner then read it all to join.
    """
    key = model._meta.pk
    fields = [model._meta.get_field(name) for name in names]
    assignments = ", ".join(f"{quote(conn, f.column)} = v.{quote(conn, f.column)}" for f in fields)  # type: ignore[union-attr]
    aliases = ", ".join(quote(conn, f.column) for f in [key, *fields])  # type: ignore[union-attr]
    arrays = ", ".join(array_of(conn, f) for f in [key, *fields])  # type: ignore[arg-type]
    name = table(conn, model)
    key_column = pk(conn, model)
    return (
        f"WITH v AS (SELECT * FROM unnest({arrays}) AS v({aliases})) UPDATE {name} SET {assignments} FROM v "
        f"WHERE {name}.{key_column} = ANY(ARRAY(SELECT {key_column} FROM v)) AND {name}.{key_column} = v.{key_column}"
    )


@builds("lock")
def lock(conn: Any, model: type[Model], keys: tuple[str, ...], skip_locked: bool) -> str:
    """``SELECT ... FOR UPDATE`` the row of ``model`` whose fields ``keys`` equal the parameters."""
    where = " AND ".join(f"{column(conn, model, name)} = %s" for name in keys)
    text = f"SELECT {columns(conn, model)} FROM {table(conn, model)} WHERE {where}"
    if conn.features.has_select_for_update:
        text += " FOR UPDATE"
        if skip_locked and conn.features.has_select_for_update_skip_locked:
            text += " SKIP LOCKED"
    return text


@builds("lock_pairs")
def lock_pairs(conn: Any, parent: type[Model], child: type[Model], link: str) -> str:
    """Lock several parents in key order, then the children given by their keys, in one statement (PostgreSQL).

    Each side is read by its primary key alone (``= ANY``), whatever the statistics say: a
    join of the children to their parents let the planner, trusting statistics taken while
    the tables were nearly empty, read a whole index of the children for what the keys find
    in a few pages. The children's condition asks for the parents' count, which reads (and
    locks) every parent before the first child is locked; the pairs are matched in memory.
    Placeholders: the parents' keys, then the children's.
    """
    key = pk(conn, parent)
    return (
        f"WITH p AS (SELECT {columns(conn, parent)} FROM {table(conn, parent)} "
        f"WHERE {key} = ANY(%s) ORDER BY {key} FOR UPDATE), "
        f"c AS (SELECT {columns(conn, child)} FROM {table(conn, child)} "
        f"WHERE {pk(conn, child)} = ANY(%s) AND (SELECT count(*) FROM p) >= 0 FOR UPDATE) "
        f"SELECT p.*, c.* FROM p JOIN c ON c.{quote(conn, link)} = p.{key}"
    )


# -- steps -----------------------------------------------------------------------------------------------


@builds("start_run")
def start_run(conn: Any, probe: bool = False) -> str:
    """A run, its first attempt and its ``started`` event in one statement, then ``NOTIFY`` (PostgreSQL).

    Placeholders: the run's columns, the attempt's and the event's (each without ``run_id``,
    which is the new run's key), then the ``NOTIFY`` channel and payload. ``ON CONFLICT DO
    NOTHING``: when a unique index refuses the run (an ongoing run of the subject, a taken
    idempotency key) nothing is written and no row comes back, with no error, so the caller's
    transaction needs no savepoint. One statement: outside a transaction it is one round trip.
    ``probe``: the row also names (``schema.name``) the function ``start()`` may call, or is
    NULL: how ``sql.functions`` learns that its function is installed, in no round trip of its
    own. Two more placeholders: the function's signature (``name(types)``) and the quoted runs
    table. Only a function of that signature in the runs table's schema, owned by the runs
    table's owner, that this role may execute, is named: never one found by its name on the
    search path, which any role that may create objects in a schema on it could have planted.
    """
    probed = f", ({_TRUSTED_FUNCTION})" if probe else ""
    return f"{start_run_rows(conn)}, pg_notify(%s, %s){probed} FROM r, s"


#: :func:`start_run`'s probe: the start function ``start()`` may call, by its signature (a placeholder),
#: in the schema of the runs table (a placeholder), owned by that table's owner.
_TRUSTED_FUNCTION = (
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(p.proname) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_proc p ON p.oid = to_regprocedure(quote_ident(n.nspname) || '.' || %s) "
    "WHERE c.oid = to_regclass(%s) AND p.proowner = c.relowner AND has_function_privilege(p.oid, 'EXECUTE')"
)


def start_run_rows(conn: Any) -> str:
    """:func:`start_run` but for its ``FROM`` and its ``NOTIFY``: the inserts, and the keys selected.

    Shared with ``start()``'s function (``sql.functions``), so that both write the same rows.
    """
    run_key = pk(conn, WorkflowRun)

    def fields(model: type[Model]) -> list[Field[Any, Any]]:
        return [f for f in model._meta.concrete_fields if not f.primary_key]

    def child(model: type[Model]) -> str:
        names = ", ".join(quote(conn, f.column) for f in fields(model))
        values = ", ".join(f"r.{run_key}" if f.attname == "run_id" else "%s" for f in fields(model))
        return f"INSERT INTO {table(conn, model)} ({names}) SELECT {values} FROM r"

    run_names = ", ".join(quote(conn, f.column) for f in fields(WorkflowRun))
    run_values = ", ".join(["%s"] * len(fields(WorkflowRun)))
    return (
        f"WITH r AS (INSERT INTO {table(conn, WorkflowRun)} ({run_names}) VALUES ({run_values}) "
        f"ON CONFLICT DO NOTHING RETURNING {run_key}), "
        f"s AS ({child(WorkflowStep)} RETURNING {pk(conn, WorkflowStep)}), "
        f"e AS ({child(WorkflowEvent)}) "
        f"SELECT r.{run_key}, s.{pk(conn, WorkflowStep)}"
    )


def start_run_types(conn: Any) -> list[str]:
    """The types of :func:`start_run_rows`'s placeholders, in order (its columns', without lengths)."""
    models = (WorkflowRun, WorkflowStep, WorkflowEvent)
    return [
        _element_type(conn, f)
        for model in models
        for f in model._meta.concrete_fields
        if not f.primary_key and (model is WorkflowRun or f.attname != "run_id")
    ]


@builds("next_attempt")
def next_attempt(conn: Any) -> str:
    """The number of a run's next attempt of a step, computed by the ``INSERT`` that adds it."""
    return (
        f"(SELECT COALESCE(MAX(attempt), 0) + 1 FROM {table(conn, WorkflowStep)} WHERE run_id = %s AND step_name = %s)"
    )


@builds("hold_steps")
def hold_steps(conn: Any) -> str:
    """Set ``held`` of a run's attempts: on its scheduled one while the run is paused, on none otherwise.

    Only rows whose flag changes are written. Placeholders: whether the run is paused, its
    key, whether it is paused (again).
    """
    status, held, run = (column(conn, WorkflowStep, name) for name in ("status", "held", "run"))
    value = f"({status} = {literal(StepStatus.SCHEDULED)} AND %s)"
    return (
        f"UPDATE {table(conn, WorkflowStep)} SET {held} = {value} WHERE {run} = %s "
        f"AND ({held} OR {status} = {literal(StepStatus.SCHEDULED)}) AND {held} <> {value}"
    )


@builds("latest_attempts")
def latest_attempts(conn: Any) -> str:
    """The latest attempt number of some steps of some runs (PostgreSQL)."""
    return (
        f"SELECT run_id, step_name, MAX(attempt) FROM {table(conn, WorkflowStep)} "
        "WHERE run_id = ANY(%s) AND step_name = ANY(%s) GROUP BY run_id, step_name"
    )


# -- fan-out jobs -------------------------------------------------------------------------------------------


@builds("record_job_successes")
def record_job_successes(conn: Any) -> str:
    """Record succeeded attempts still running, with their results, returning their keys (PostgreSQL)."""
    running, succeeded = (literal(status) for status in job_event("succeed"))
    return (
        f"UPDATE {table(conn, FanOutJob)} j SET status = {succeeded}, finished_at = %s, stall_at = NULL, "
        "result = v.result FROM unnest(%b::bigint[], %b::integer[], %b::jsonb[]) AS v(id, attempts, result) "
        f"WHERE j.id = v.id AND j.status = {running} AND j.attempts = v.attempts RETURNING j.id"
    )


# -- runs, sessions and transactions -------------------------------------------------------------------------


@builds("delete_runs")
def delete_runs(conn: Any) -> str:
    """Delete runs by key that are still finished or cancelled (PostgreSQL: the database cascades)."""
    return f"DELETE FROM {table(conn, WorkflowRun)} WHERE id = ANY(%s) AND status = ANY(%s)"


@builds("notify")
def notify(conn: Any) -> str:
    """Wake the dispatchers of a queue (PostgreSQL: ``NOTIFY`` with the queue as payload)."""
    return "SELECT pg_notify(%s, %s)"


@builds("advisory_xact_lock")
def advisory_xact_lock(conn: Any) -> str:
    """Try to take a transaction-level advisory lock; true when taken (PostgreSQL)."""
    return "SELECT pg_try_advisory_xact_lock(%s)"


@builds("database_clock")
def database_clock(conn: Any) -> str:
    """The database server's clock now (not the transaction's start)."""
    return "SELECT clock_timestamp()"


@builds("bound_transaction")
def bound_transaction(conn: Any) -> str:
    """Bound the rest of this transaction's statements and idle time (PostgreSQL)."""
    return (
        "SELECT set_config('statement_timeout', %s, true), set_config('idle_in_transaction_session_timeout', %s, true)"
    )


@builds("lock_timeout")
def lock_timeout(conn: Any) -> str:
    """Bound every later wait for a lock in this session (PostgreSQL; a parameter such as ``'900ms'``)."""
    return "SELECT set_config('lock_timeout', %s, false)"


@builds("constraints_immediate")
def constraints_immediate(conn: Any) -> str:
    """Check the deferred constraints now (PostgreSQL)."""
    return "SET CONSTRAINTS ALL IMMEDIATE"


@builds("constraints_deferred")
def constraints_deferred(conn: Any) -> str:
    """Defer the deferrable constraints again (PostgreSQL)."""
    return "SET CONSTRAINTS ALL DEFERRED"


#: The engine's own statements find a few rows by their keys: planned without bitmap or
#: sequential scans for the rest of the transaction (``sql.fetch_in_index_order`` says why),
#: and never compiled. A statement's estimate grows with rows it will never read (the steps
#: waiting for later that a claim's look-ahead passes by, say), and above ``jit_above_cost``
#: PostgreSQL spent 25 ms compiling a claim that ran in 1 ms.
INDEX_PLANS = (
    "set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true), "
    "set_config('jit', 'off', true)"
)
