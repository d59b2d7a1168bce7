"""Lean reads and writes of single rows for the hot path: no ORM compiler, no ``Model.__init__``.

Running a step writes a handful of rows; building each statement through the ORM cost more
CPU than the database spent on it. These helpers write exactly what ``Model.save`` would
(values prepared by each field's ``get_db_prep_save``) and read rows back as the ORM would
(its converters); the statements' texts are the :mod:`.sql` module's, built once each.
Everything off the hot path uses the ORM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, ProgrammingError, connection, connections, models
from django.db.models import Field, Model
from django.db.models.base import ModelState

from .. import sql
from ..sql import Statement, functions

M = TypeVar("M", bound=Model)
N = TypeVar("N", bound=Model)
_converters: dict[tuple[type[Model], str, str], list[tuple[str, Any, list[Any]]]] = {}
_plans: dict[type[Model], _BuildPlan] = {}


#: ``get_db_prep_save(value, connection)`` of a field.
Prepare = Callable[[Any, Any], Any]
#: Fields whose ``get_db_prep_save`` returns a value psycopg sends as it is (PostgreSQL).
_PLAIN = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.BooleanField,
    models.AutoField,
    models.BigAutoField,
    models.DateTimeField,
)
_preparers: dict[tuple[type[Model], str, str], Prepare | None] = {}
_columns: dict[tuple[type[Model], str, tuple[str, ...]], list[tuple[str, Prepare | None]]] = {}


def preparer(model: type[Model], field: Field[Any, Any]) -> Prepare | None:
    """What turns the attribute value of ``field`` into the value sent (``get_db_prep_save``); None: nothing."""
    key = (model, field.attname, connection.vendor)
    if key not in _preparers:
        target = field.target_field if field.is_relation else field  # type: ignore[attr-defined]
        native_duration = isinstance(target, models.DurationField) and connection.features.has_native_duration_field
        # psycopg sends these Python values as they are; SQLite's driver wants Django's text for some.
        plain = sql.postgresql() and (isinstance(target, _PLAIN) or native_duration)
        _preparers[key] = None if plain else field.get_db_prep_save
    return _preparers[key]


def insert_columns(model: type[Model], leave_out: tuple[str, ...] = ()) -> list[tuple[str, Prepare | None]]:
    """``(attname, preparer)`` of the columns an ``INSERT`` writes, in field order, but for ``leave_out``.

    The attribute is read as it is: ``Field.pre_save`` returns it unchanged, as no field of
    the app's models is ``auto_now`` (``tests/sql/test_sql.py`` checks).
    """
    key = (model, connection.vendor, leave_out)
    found = _columns.get(key)
    if found is None:
        fields = [f for f in model._meta.concrete_fields if not f.primary_key and f.attname not in leave_out]
        found = _columns[key] = [(field.attname, preparer(model, field)) for field in fields]
    return found


def prepared(instance: Model, attname: str, prepare: Prepare | None, db: Any) -> Any:
    """The value of ``instance``'s attribute as sent to the database (``get_db_prep_save``)."""
    value = getattr(instance, attname)
    return value if prepare is None else prepare(value, db)


def column_values(instances: Sequence[Model], attname: str, prepare: Prepare | None, db: Any) -> list[Any]:
    """:func:`prepared` of one attribute of many instances (a column of a many-row statement).

    The attributes are read in C (``attrgetter``), not by a call per value: a column of a
    10,000-run ``start_many()`` is 10,000 values.
    """
    values = list(map(attrgetter(attname), instances))
    return values if prepare is None else [prepare(value, db) for value in values]


def _fields(model: type[Model], names: Sequence[str]) -> list[Field[Any, Any]]:
    return [model._meta.get_field(name) for name in names]  # type: ignore[misc]


def update(instance: Model, names: Sequence[str]) -> None:
    """``UPDATE`` the columns of ``names`` of one row (like ``save(update_fields=names)``)."""
    sql.run_batch([update_statement(instance, names)])


def update_statement(instance: Model, names: Sequence[str]) -> Statement:
    """The ``UPDATE`` that :func:`update` runs, to batch with others."""
    model = type(instance)
    text = sql.statement("update", model, tuple(names))
    params = [f.get_db_prep_save(getattr(instance, f.attname), connection) for f in _fields(model, names)]
    return text, [*params, instance.pk]


def insert(instance: Model, computed: dict[str, tuple[str, list[Any]]] | None = None) -> Any:
    """``INSERT`` one row and set its primary key; ``computed`` columns take an SQL expression.

    ``computed`` maps a field name to ``(sql, params)``; its value is read back and set on the
    instance (``RETURNING``).
    """
    model = type(instance)
    computed = computed or {}
    text = sql.statement("insert", model, tuple((name, expression) for name, (expression, _) in computed.items()))
    params: list[Any] = []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        if field.name in computed:
            params.extend(computed[field.name][1])
        else:
            params.append(field.get_db_prep_save(field.pre_save(instance, True), connection))
    with sql.cursor() as cursor:
        cursor.execute(text, params)
        row = cursor.fetchone()
    mark_saved(instance, row[0])
    for name, value in zip(computed, row[1:], strict=True):
        setattr(instance, name, value)
    return instance


def insert_run(run: Model, step: Model, event: Model, notify: tuple[str, str]) -> bool:
    """Insert a new run with its first attempt and its first event, and ``NOTIFY`` (PostgreSQL).

    One statement (``sql`` ``start_run``), bound on the server: its text is parsed once per
    process, not per call, whatever its number of parameters. Where the connection may not
    prepare it, from its Nth start on, a call of the same statement as a server-side function
    instead, which the server plans once per session (:mod:`.sql.functions`). False, and
    nothing written, when a unique index refuses the run. The attempt's and the event's
    ``run`` is the new run; keys are set.
    """
    db = connections[DEFAULT_DB_ALIAS]  # resolved once: each attribute read through the proxy costs a lookup
    params = [prepared(run, attname, prepare, db) for attname, prepare in insert_columns(type(run))]
    for child in (step, event):
        params += [prepared(child, a, p, db) for a, p in insert_columns(type(child), leave_out=("run_id",))]
    params += notify
    with sql.bound_cursor(timestamps=False) as cursor:  # it returns keys
        row = _start_row(cursor, db, params)
    if row is None:
        return False
    mark_saved(run, row[0])
    mark_saved(step, row[1])
    for child in (step, event):
        child.run_id = row[0]  # type: ignore[attr-defined]
    return True


def _start_row(cursor: Any, db: Any, params: list[Any]) -> Any:
    """Run ``start()``'s statement, or its function, as :func:`.sql.functions.start_path` says; its row (or None)."""
    raw = db.connection
    function, probe = (None, False) if sql.prepares(raw) else functions.start_path(raw)
    if function is not None:
        try:
            cursor.execute(sql.statement("start_call", function), params)
        except ProgrammingError as error:
            if not isinstance(error.__cause__, psycopg.errors.UndefinedFunction | psycopg.errors.InsufficientPrivilege):
                raise
            functions.forget(raw)  # dropped (or revoked) under this connection: the statement from now on
            if db.in_atomic_block:
                raise  # the caller's transaction is aborted: nothing can be run in it again
            cursor.execute(sql.statement("start_run"), params)
        return cursor.fetchone()
    if not probe:
        cursor.execute(sql.statement("start_run"), params)
        return cursor.fetchone()
    cursor.execute(sql.statement("start_run", True), [*params, *functions.probe_params(db)])
    row = cursor.fetchone()
    if row is not None:  # a refused start says nothing: the next one asks again
        functions.found(raw, row[3])
    return row


def lock(model: type[M], keys: dict[str, Any], *, skip_locked: bool = False) -> M | None:
    """``SELECT ... FOR UPDATE`` the row of ``model`` whose fields equal ``keys`` (None: no such row).

    ``skip_locked``: None at once when another transaction holds the row.
    """
    with sql.cursor() as cursor:
        cursor.execute(sql.statement("lock", model, tuple(keys), skip_locked), list(keys.values()))
        row = cursor.fetchone()
    return None if row is None else from_row(model, row)


def lock_pair(parent: type[M], child: type[N], link: str, parent_pk: Any, child_pk: Any) -> tuple[M, N] | None:
    """Lock a parent row, then one of its children, in one round trip (PostgreSQL): :func:`lock_pairs` of one.

    The child's ``FOR UPDATE`` re-reads it at its latest committed version. None when either
    row is missing, or the child is another parent's (the caller then locks them one by one
    to tell which).
    """
    return lock_pairs(parent, child, link, [(parent_pk, child_pk)])[0].get(child_pk)


def lock_pairs(
    parent: type[M], child: type[N], link: str, pairs: Sequence[tuple[Any, Any]], *, then: Statement | None = None
) -> tuple[dict[Any, tuple[M, N]], list[tuple[Any, ...]]]:
    """Lock several parents (in key order), then one child of each, in one round trip (PostgreSQL).

    ``pairs`` are ``(parent pk, child pk)``; returns ``{child pk: (parent, child)}`` for the
    pairs that exist, and the rows of the query ``then`` (sent in the same round trip, after
    the locks). Parents are locked in ascending key order, all before any child, so two
    batches never deadlock, and the lock order is the same as for one pair.
    """
    params: list[Any] = [[p for p, _ in pairs], [c for _, c in pairs]]
    extra: list[tuple[Any, ...]] = []
    with sql.pipeline() as cursor:
        cursor.execute(sql.statement("lock_pairs", parent, child, link), params)
        if then is not None:
            second = sql.pipelined_cursor()
            try:
                second.execute(then[0], then[1])
                found = cursor.fetchall()
                extra = second.fetchall()
            finally:
                second.close()
        else:
            found = cursor.fetchall()
    split = len(parent._meta.concrete_fields)
    locked = {}
    for row in found:
        child_row = from_row(child, row[split:])
        locked[child_row.pk] = (from_row(parent, row[:split]), child_row)
    return locked, extra


def from_row(model: type[M], row: Sequence[Any]) -> M:
    """A model instance from raw column values (all concrete fields), converted as the ORM would."""
    db = connections[DEFAULT_DB_ALIAS]  # resolved once: each attribute read through the proxy costs a lookup
    key = (model, db.alias, db.vendor)
    columns = _converters.get(key)
    if columns is None:
        columns = []
        for field in model._meta.concrete_fields:
            column = field.get_col(model._meta.db_table)
            converters = db.ops.get_db_converters(column) + column.get_db_converters(db)
            columns.append((field.attname, column, converters))
        _converters[key] = columns  # converters take the connection as an argument
    instance = model.__new__(model)
    values = instance.__dict__
    for (attname, column, converters), value in zip(columns, row, strict=True):
        for converter in converters:
            value = converter(value, column, db)
        values[attname] = value
    instance._state = ModelState()
    instance._state.adding = False
    instance._state.db = db.alias
    return instance


def build(model: type[M], **values: Any) -> M:
    """A new unsaved instance, as ``model(**values)`` makes it, for the hot path.

    ``Model.__init__`` costs more than the rest of a step's bookkeeping: this sets the
    attributes directly (defaults first, then ``values``; a relation's key and its cached
    object, as its descriptor would). It sends no ``pre_init``/``post_init`` signals: the
    app's models need none.
    """
    plan = _plans.get(model)
    if plan is None:
        plan = _plans[model] = _BuildPlan(model)
    instance = model.__new__(model)
    attributes = instance.__dict__
    given = {plan.relations.get(name, name) for name in values}
    for attname, factory, default in plan.defaults:
        if attname not in given:  # a default factory (a clock, a UUID) is only called when needed
            attributes[attname] = factory() if factory is not None else default
    instance._state = ModelState()
    for name, value in values.items():
        if name in plan.relations:
            attributes[plan.relations[name]] = None if value is None else value.pk
            instance._state.fields_cache[name] = value
        elif name in plan.attnames:
            attributes[name] = value
        else:
            setattr(instance, name, value)
    return instance


class _BuildPlan:
    """How :func:`build` fills an instance of one model."""

    def __init__(self, model: type[Model]) -> None:
        fields = model._meta.concrete_fields
        self.defaults = [
            (f.attname, f.default if f.has_default() and callable(f.default) else None, f.get_default()) for f in fields
        ]
        #: Relation name -> the attribute holding its key.
        self.relations = {f.name: f.attname for f in fields if f.is_relation}
        #: Plain fields, set as they are.
        self.attnames = {f.attname for f in fields if not f.is_relation}


def clone(instance: M, **values: Any) -> M:
    """A new unsaved copy of an unsaved ``instance`` with some plain fields changed (many rows alike)."""
    copy = type(instance).__new__(type(instance))
    copy.__dict__.update(instance.__dict__)
    copy.__dict__.update(values)
    copy._state = ModelState()
    return copy


def mark_saved(instance: Model, pk: Any) -> None:
    """Record that ``instance`` is now the row with key ``pk``."""
    instance.pk = pk
    instance._state.adding = False
    instance._state.db = connection.alias
