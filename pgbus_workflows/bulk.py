"""Writes of many rows at once: one statement per model and set of columns, whatever the count.

Several runs' units of work are written together (:class:`WriteBatch`). On PostgreSQL each
statement (``sql.statements``: ``unnest_insert``, ``unnest_update``) takes its values as one
array per column, so its text is the same for any number of rows: psycopg and the server
parse it once, not once per batch size.
Values are prepared as ``Model.save`` would; the plain column types skip the field's
preparation, which would return them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, models
from django.db.models import Field, Model

from . import rows, sql
from .sql import Statement

Prepare = Callable[[Any], Any]
_PLAIN = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.BooleanField,
    models.AutoField,
    models.BigAutoField,
    models.DateTimeField,
)
_preparers: dict[tuple[type[Model], str, str], Prepare] = {}
_relations: dict[type[Model], list[Field[Any, Any]]] = {}


def _preparer(model: type[Model], field: Field[Any, Any]) -> Prepare:
    """What turns the attribute value of ``field`` into the value sent (``get_db_prep_save``)."""
    key = (model, field.attname, connection.vendor)
    prepare = _preparers.get(key)
    if prepare is None:
        target = field.target_field if field.is_relation else field  # type: ignore[attr-defined]
        native_duration = isinstance(target, models.DurationField) and connection.features.has_native_duration_field
        if isinstance(target, _PLAIN) or native_duration:
            prepare = _same
        else:
            prepare = _bound(field)
        _preparers[key] = prepare
    return prepare


def _same(value: Any) -> Any:
    return value


def _bound(field: Field[Any, Any]) -> Prepare:
    return lambda value: field.get_db_prep_save(value, connection)


def insert_statement(instances: Sequence[Model], *, returning: bool = False) -> Statement:
    """One ``INSERT`` of ``instances`` (all of one model), ``RETURNING`` their keys in order."""
    if not sql.postgresql():
        return rows.insert_many_statement(instances, returning=returning)
    model = type(instances[0])
    params = []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        prepare = _preparer(model, field)
        params.append([prepare(field.pre_save(obj, True)) for obj in instances])
    return sql.statement("unnest_insert", model, returning), params


def update_statements(changes: Sequence[tuple[Model, frozenset[str]]]) -> list[Statement]:
    """``UPDATE`` rows by key: one statement per model and set of changed fields.

    Each row appears once (the caller merges the fields of a row changed twice).
    """
    if not sql.postgresql():
        return [rows.update_statement(instance, sorted(names)) for instance, names in changes]
    groups: dict[tuple[type[Model], frozenset[str]], list[Model]] = {}
    for instance, names in changes:
        groups.setdefault((type(instance), names), []).append(instance)
    statements = []
    for (model, names), instances in groups.items():
        ordered = tuple(sorted(names))
        params: list[Any] = [[obj.pk for obj in instances]]
        for name in ordered:
            field = model._meta.get_field(name)
            prepare = _preparer(model, field)  # type: ignore[arg-type]
            params.append([prepare(getattr(obj, field.attname)) for obj in instances])  # type: ignore[union-attr]
        statements.append((sql.statement("unnest_update", model, ordered), params))
    return statements


class WriteBatch:
    """The writes of several units of work, sent together: two round trips for any number.

    A ledger with a batch defers its writes here. :meth:`send` runs the updates, then the
    inserts (their keys read back), in one round trip; then the rows that refer to those
    (the events, now that every new step has its key) and the NOTIFYs. Updates go first so
    a run's ended attempt is no longer active when its next one is inserted.
    """

    def __init__(self) -> None:
        self._changes: dict[tuple[type[Model], Any], tuple[Model, set[str]]] = {}
        self.inserts: list[Model] = []
        self.rows: list[Model] = []
        self.notify: set[str] = set()

    def update(self, instance: Model, names: Sequence[str]) -> None:
        """Defer an ``UPDATE``; a row still to be inserted is written with its new values anyway."""
        if instance.pk is None:
            return
        key = (type(instance), instance.pk)
        if key in self._changes:
            self._changes[key][1].update(names)
        else:
            self._changes[key] = (instance, set(names))

    def send(self, channel: str) -> None:
        """Run every deferred write (inside the caller's transaction)."""
        head = update_statements([(obj, frozenset(names)) for obj, names in self._changes.values()])
        if not sql.postgresql():
            sql.run_batch(head)
            for instance in self.inserts:
                rows.insert(instance)
            if self.rows:
                sql.run_batch([insert_statement(link(self.rows))])
            return
        with sql.pipeline() as cursor:
            for text, params in head:
                cursor.execute(text, params)
            if self.inserts:
                cursor.execute(*insert_statement(self.inserts, returning=True))
                keys = cursor.fetchall()  # the first round trip
                for instance, (pk,) in zip(self.inserts, keys, strict=True):
                    rows.mark_saved(instance, pk)
            if self.rows:
                cursor.execute(*insert_statement(link(self.rows)))
            notify = sql.statement("notify")
            for queue in sorted(self.notify):
                cursor.execute(notify, [channel, queue])


def link(instances: Sequence[Model]) -> Sequence[Model]:
    """Set the foreign keys of ``instances`` to rows inserted since they were made; returns them."""
    for row in instances:
        model = type(row)
        relations = _relations.get(model)
        if relations is None:
            relations = _relations[model] = [f for f in model._meta.concrete_fields if f.is_relation]
        for field in relations:
            if getattr(row, field.attname) is None:
                related = getattr(row, field.name, None)
                if related is not None:
                    setattr(row, field.attname, related.pk)
    return instances
