"""Lean writes for the hot path: one cached statement per (model, fields), no ORM compiler.

Running a step writes a handful of rows; building each statement through the ORM cost more
CPU than the database spent on it. These helpers write exactly what ``Model.save`` would
(values prepared by each field's ``get_db_prep_save``), with the SQL text built once.
Reads and everything off the hot path still use the ORM.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field, Model
from django.db.models.base import ModelState

M = TypeVar("M", bound=Model)
N = TypeVar("N", bound=Model)
_statements: dict[tuple[Any, ...], str] = {}
_defaults: dict[type[Model], list[tuple[str, Any, Any]]] = {}
_converters: dict[tuple[type[Model], str], list[tuple[str, Any, list[Any]]]] = {}


def quote(name: str | None) -> str:
    """``name`` quoted for the database."""
    return connection.ops.quote_name(str(name))


def _pk_column(model: type[Model]) -> str:
    return quote(model._meta.pk.column if model._meta.pk else "id")


def _fields(model: type[Model], names: Sequence[str]) -> list[Field[Any, Any]]:
    return [model._meta.get_field(name) for name in names]  # type: ignore[misc]


Statement = tuple[str, list[Any]]


def run_batch(statements: Sequence[Statement]) -> None:
    """Run statements that return nothing, in one round trip where the database allows it.

    On PostgreSQL, Django's client-side binding cursor sends them as one simple query; with
    ``OPTIONS={"server_side_binding": True}`` (where one query may hold one statement) they
    go in a pipeline instead, still one round trip.
    """
    if not statements:
        return
    if connection.vendor == "postgresql" and len(statements) > 1 and _server_side_binding():
        with pipeline() as raw:
            for sql, params in statements:
                raw.execute(sql, params)
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql" and len(statements) > 1:
            cursor.execute("; ".join(sql for sql, _ in statements), [p for _, params in statements for p in params])
        else:
            for sql, params in statements:
                cursor.execute(sql, params)


def _server_side_binding() -> bool:
    return bool(connection.settings_dict.get("OPTIONS", {}).get("server_side_binding"))


def update(instance: Model, names: Sequence[str]) -> None:
    """``UPDATE`` the columns of ``names`` of one row (like ``save(update_fields=names)``)."""
    run_batch([update_statement(instance, names)])


def update_statement(instance: Model, names: Sequence[str]) -> Statement:
    """The ``UPDATE`` that :func:`update` runs, to batch with others."""
    model = type(instance)
    fields = _fields(model, names)
    key = ("update", model, tuple(names))
    sql = _statements.get(key)
    if sql is None:
        assignments = ", ".join(f"{quote(f.column)} = %s" for f in fields)
        sql = f"UPDATE {quote(model._meta.db_table)} SET {assignments} WHERE {_pk_column(model)} = %s"
        _statements[key] = sql
    params = [f.get_db_prep_save(getattr(instance, f.attname), connection) for f in fields]
    return sql, [*params, instance.pk]


def insert(instance: Model, computed: dict[str, tuple[str, list[Any]]] | None = None) -> Any:
    """``INSERT`` one row and set its primary key; ``computed`` columns take an SQL expression.

    ``computed`` maps a field name to ``(sql, params)``; its value is read back and set on the
    instance (``RETURNING``).
    """
    model = type(instance)
    meta = model._meta
    computed = computed or {}
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    key = ("insert", model, tuple(sorted(computed)), tuple(sql for sql, _ in computed.values()))
    sql = _statements.get(key)
    if sql is None:
        columns = ", ".join(quote(f.column) for f in fields)
        values = ", ".join(computed[f.name][0] if f.name in computed else "%s" for f in fields)
        extra = [quote(field.column) for field in _fields(model, list(computed))]
        returning = ", ".join([_pk_column(model), *extra])
        sql = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({values}) RETURNING {returning}"
        _statements[key] = sql
    params: list[Any] = []
    for field in fields:
        if field.name in computed:
            params.extend(computed[field.name][1])
        else:
            params.append(field.get_db_prep_save(field.pre_save(instance, True), connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    mark_saved(instance, row[0])
    for name, value in zip(computed, row[1:], strict=True):
        setattr(instance, name, value)
    return instance


def insert_many_statement(instances: Sequence[Model], *, returning: bool = False) -> Statement:
    """One ``INSERT`` of several rows of one model, to batch with others (``RETURNING`` the keys)."""
    model = type(instances[0])
    meta = model._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    columns = ", ".join(quote(f.column) for f in fields)
    sql = f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES " + ", ".join([row] * len(instances))
    if returning:
        sql += f" RETURNING {_pk_column(model)}"
    params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for obj in instances for f in fields]
    return sql, params


def lock(model: type[M], where: str, params: Sequence[Any], *, skip_locked: bool = False) -> M | None:
    """``SELECT ... FOR UPDATE`` one row of ``model`` (``where`` is SQL on its own columns).

    ``skip_locked``: None at once when another transaction holds the row.
    """
    key = ("lock", model, where, skip_locked, connection.vendor)
    sql = _statements.get(key)
    if sql is None:
        sql = f"SELECT {_columns(model)} FROM {quote(model._meta.db_table)} WHERE {where}"
        if connection.features.has_select_for_update:
            sql += " FOR UPDATE"
            if skip_locked and connection.features.has_select_for_update_skip_locked:
                sql += " SKIP LOCKED"
        _statements[key] = sql
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        row = cursor.fetchone()
    return None if row is None else from_row(model, row)


def lock_pair(parent: type[M], child: type[N], link: str, parent_pk: Any, child_pk: Any) -> tuple[M, N] | None:
    """Lock a parent row, then one of its children, in one round trip (PostgreSQL).

    The CTE locks the parent first, so the lock order is the same as two statements; the
    child's ``FOR UPDATE`` then re-reads it at its latest committed version. None when either
    row is missing (the caller then locks them one by one to tell which).
    """
    key = ("pair", parent, child, link)
    sql = _statements.get(key)
    if sql is None:
        parent_table, child_table = quote(parent._meta.db_table), quote(child._meta.db_table)
        child_columns = ", ".join(f"c.{quote(f.column)}" for f in child._meta.concrete_fields)
        sql = (
            f"WITH p AS (SELECT {_columns(parent)} FROM {parent_table} WHERE {_pk_column(parent)} = %s FOR UPDATE) "
            f"SELECT p.*, {child_columns} FROM p JOIN {child_table} c "
            f"ON c.{_pk_column(child)} = %s AND c.{quote(link)} = p.{_pk_column(parent)} FOR UPDATE OF c"
        )
        _statements[key] = sql
    with connection.cursor() as cursor:
        cursor.execute(sql, [parent_pk, child_pk])
        row = cursor.fetchone()
    if row is None:
        return None
    split = len(parent._meta.concrete_fields)
    return from_row(parent, row[:split]), from_row(child, row[split:])


def _columns(model: type[Model]) -> str:
    return ", ".join(quote(f.column) for f in model._meta.concrete_fields)


def from_row(model: type[M], row: Sequence[Any]) -> M:
    """A model instance from raw column values (all concrete fields), converted as the ORM would."""
    columns = _converters.get((model, connection.vendor))
    if columns is None:
        columns = []
        for field in model._meta.concrete_fields:
            column = field.get_col(model._meta.db_table)
            converters = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            columns.append((field.attname, column, converters))
        _converters[(model, connection.vendor)] = columns  # converters take the connection as an argument
    instance = model.__new__(model)
    values = instance.__dict__
    for (attname, column, converters), value in zip(columns, row, strict=True):
        for converter in converters:
            value = converter(value, column, connection)
        values[attname] = value
    instance._state = ModelState()
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance


def build(model: type[M], **values: Any) -> M:
    """A new unsaved instance, as ``model(**values)`` makes it, for the hot path.

    ``Model.__init__`` costs more than the rest of a step's bookkeeping: this sets the
    attributes directly (defaults first, then ``values``; relations through their
    descriptors). It sends no ``pre_init``/``post_init`` signals: the app's models need none.
    """
    defaults = _defaults.get(model)
    if defaults is None:
        defaults = _defaults[model] = [
            (f.attname, f.default if f.has_default() and callable(f.default) else None, f.get_default())
            for f in model._meta.concrete_fields
        ]
    instance = model.__new__(model)
    attributes = instance.__dict__
    for attname, factory, default in defaults:
        attributes[attname] = factory() if factory is not None else default
    instance._state = ModelState()
    for name, value in values.items():
        setattr(instance, name, value)
    return instance


def mark_saved(instance: Model, pk: Any) -> None:
    """Record that ``instance`` is now the row with key ``pk``."""
    instance.pk = pk
    instance._state.adding = False
    instance._state.db = connection.alias


@contextmanager
def pipeline() -> Iterator[Any]:
    """A psycopg cursor with server-side binding whose statements are pipelined (PostgreSQL).

    Statements queue up and go to the server together: one round trip for all of them, or
    one more for each ``fetch`` in between. Inside the caller's transaction; errors come
    out as Django's database exceptions.
    """
    import psycopg

    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = connection.connection
        with raw.pipeline(), psycopg.Cursor(raw) as cursor:
            yield cursor


def lock_pairs(
    parent: type[M], child: type[N], link: str, pairs: Sequence[tuple[Any, Any]], *, then: Statement | None = None
) -> tuple[dict[Any, tuple[M, N]], list[tuple[Any, ...]]]:
    """Lock several parents (in key order), then one child of each, in one round trip (PostgreSQL).

    ``pairs`` are ``(parent pk, child pk)``; returns ``{child pk: (parent, child)}`` for the
    pairs that exist, and the rows of the query ``then`` (sent in the same round trip, after
    the locks). Parents are locked in ascending key order, all before any child, so two
    batches never deadlock, and the lock order is the same as for one pair.
    """
    key = ("pairs", parent, child, link)
    sql = _statements.get(key)
    if sql is None:
        parent_table, child_table = quote(parent._meta.db_table), quote(child._meta.db_table)
        child_columns = ", ".join(f"c.{quote(f.column)}" for f in child._meta.concrete_fields)
        pk = _pk_column(parent)
        sql = (
            f"WITH p AS (SELECT {_columns(parent)} FROM {parent_table} WHERE {pk} = ANY(%s) ORDER BY {pk} FOR UPDATE) "
            f"SELECT p.*, {child_columns} FROM p JOIN {child_table} c "
            f"ON c.{quote(link)} = p.{pk} WHERE c.{_pk_column(child)} = ANY(%s) FOR UPDATE OF c"
        )
        _statements[key] = sql
    params: list[Any] = [[p for p, _ in pairs], [c for _, c in pairs]]
    extra: list[tuple[Any, ...]] = []
    with pipeline() as cursor:
        cursor.execute(sql, params, prepare=True)
        if then is not None:
            import psycopg

            with psycopg.Cursor(cursor.connection) as second:
                second.execute(then[0], then[1], prepare=True)
                found = cursor.fetchall()
                extra = second.fetchall()
        else:
            found = cursor.fetchall()
    split = len(parent._meta.concrete_fields)
    locked = {}
    for row in found:
        child_row = from_row(child, row[split:])
        locked[child_row.pk] = (from_row(parent, row[:split]), child_row)
    return locked, extra
