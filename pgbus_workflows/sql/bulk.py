"""Writes of many rows at once: one statement per model and set of columns, whatever the count.

Several runs' units of work are written together (:class:`WriteBatch`). On PostgreSQL a
statement of many rows (``sql.statements``: ``unnest_insert``, ``unnest_update``) takes its
values as one array per column, so its text is the same for any number of rows: psycopg and
the server parse it once, not once per batch size. Up to :data:`FEW_ROWS` rows (a trickle of
runs, one or two outcomes per batch) each value is a parameter of its own instead: psycopg
dumps a scalar in C and an array in Python, and below that count the arrays cost more CPU
than the extra statement texts (one per count, prepared once each) cost the server.
Values are prepared as ``Model.save`` would; the plain column types skip the field's
preparation, which would return them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field, Model

from .. import sql
from ..sql import Statement
from . import rows

#: Up to this many rows, a statement takes a parameter per value rather than an array per column.
FEW_ROWS = 8
#: Rows per statement on SQLite, which caps the parameters of one statement (32,766).
SQLITE_ROWS = 500
_relations: dict[type[Model], list[Field[Any, Any]]] = {}


def insert_statement(
    instances: Sequence[Model], *, returning: tuple[str, ...] = (), skip_conflicts: bool = False, arrays: bool = True
) -> Statement:
    """One ``INSERT`` of ``instances`` (all of one model), ``RETURNING`` the ``returning`` fields in order.

    ``skip_conflicts``: rows a unique index refuses are left out, with no error (and nothing
    returned). ``arrays=False``: a parameter per value whatever the count (a cursor that binds
    on the client; the arrays' statement binds on the server, :func:`sql.pipeline`).
    """
    model = type(instances[0])
    columns = rows.insert_columns(model)
    db = connections[DEFAULT_DB_ALIAS]  # resolved once: each attribute read through the proxy costs a lookup
    if len(instances) <= FEW_ROWS or not arrays or not sql.postgresql():
        text = sql.statement("insert_many", model, len(instances), returning, skip_conflicts)
        return text, [rows.prepared(obj, attname, prepare, db) for obj in instances for attname, prepare in columns]
    constants: list[Any] = []
    varying: list[list[Any]] = []
    names = []
    for attname, prepare in columns:
        values = rows.column_values(instances, attname, prepare, db)
        first = values[0]
        # A value every row shares goes once (a JSON value is an adapter object: never shared).
        if not isinstance(first, (list, dict)) and values.count(first) == len(values):
            constants.append(first)
            names.append(attname)
        else:
            varying.append(values)
    if not varying:  # unnest() needs one array: the first column's
        varying.append([constants.pop(0)] * len(instances))
        names.pop(0)
    text = sql.statement("unnest_insert", model, returning, skip_conflicts, tuple(names))
    return text, [*constants, *varying]


def insert_statements(
    instances: Sequence[Model], *, returning: tuple[str, ...] = (), skip_conflicts: bool = False
) -> list[Statement]:
    """:func:`insert_statement` of any number of rows: one statement on PostgreSQL, chunks on SQLite."""
    size = len(instances) if sql.postgresql() else SQLITE_ROWS
    return [
        insert_statement(instances[n : n + size], returning=returning, skip_conflicts=skip_conflicts)
        for n in range(0, len(instances), size)
    ]


def update_statements(changes: Sequence[tuple[Model, frozenset[str]]]) -> list[Statement]:
    """``UPDATE`` rows by key: one statement per model and set of changed fields.

    Each row appears once (the caller merges the fields of a row changed twice).
    """
    groups: dict[tuple[type[Model], frozenset[str]], list[Model]] = {}
    for instance, names in changes:
        groups.setdefault((type(instance), names), []).append(instance)
    statements = []
    db = connections[DEFAULT_DB_ALIAS]
    for (model, names), instances in groups.items():
        ordered = tuple(sorted(names))
        columns = [(field.attname, rows.preparer(model, field)) for field in _fields(model, ordered)]
        if len(instances) <= FEW_ROWS or not sql.postgresql():
            text = sql.statement("update", model, ordered)
            for obj in instances:
                statements.append((text, [*(rows.prepared(obj, a, p, db) for a, p in columns), obj.pk]))
            continue
        params: list[Any] = [[obj.pk for obj in instances]]
        params += [rows.column_values(instances, attname, prepare, db) for attname, prepare in columns]
        statements.append((sql.statement("unnest_update", model, ordered), params))
    return statements


def _fields(model: type[Model], names: Sequence[str]) -> list[Field[Any, Any]]:
    return [model._meta.get_field(name) for name in names]  # type: ignore[misc]


class WriteBatch:
    """The writes of several units of work, sent together: two round trips for any number.

    A ledger with a batch defers its writes here. :meth:`send` runs the updates, then the
    inserts (their keys read back), in one round trip; then the rows that refer to those
    (the events, now that every new step has its key), the statements that read the rows
    written (``after``) and the NOTIFYs. Updates go first so
    a run's ended attempt is no longer active when its next one is inserted.
    """

    def __init__(self) -> None:
        self._changes: dict[tuple[type[Model], Any], tuple[Model, set[str]]] = {}
        self.inserts: list[Model] = []
        self.rows: list[Model] = []
        self.notify: set[str] = set()
        #: Workflow ids of awaited runs that ended: NOTIFY on ``{channel}_ended``.
        self.ended: set[str] = set()
        #: Statements run after every other write: they read the rows written before them.
        self.after: list[Statement] = []
        #: Writes that the batch's units make one statement of, by name (sorted), before ``after``:
        #: ``(builder of the statement from every unit's items, the items)``. One statement locks
        #: its rows in one order, where one per unit, in unit order, could deadlock two batches.
        self.merged: dict[str, tuple[Callable[[list[Any]], Statement], list[Any]]] = {}

    def update(self, instance: Model, names: Sequence[str]) -> None:
        """Defer an ``UPDATE``; a row still to be inserted is written with its new values anyway."""
        if instance.pk is None:
            return
        key = (type(instance), instance.pk)
        if key in self._changes:
            self._changes[key][1].update(names)
        else:
            self._changes[key] = (instance, set(names))

    def merge(self, name: str, build: Callable[[list[Any]], Statement], items: Sequence[Any]) -> None:
        """Add ``items`` to the batch's one ``name`` statement, which ``build`` makes of them all at :meth:`send`."""
        self.merged.setdefault(name, (build, []))[1].extend(items)

    def send(self, channel: str) -> None:
        """Run every deferred write (inside the caller's transaction)."""
        head = update_statements([(obj, frozenset(names)) for obj, names in self._changes.values()])
        self.after[:0] = [build(items) for _name, (build, items) in sorted(self.merged.items()) if items]
        self.merged = {}
        if not sql.postgresql():
            sql.run_batch(head)
            for instance in self.inserts:
                rows.insert(instance)
            if self.rows:
                sql.run_batch(insert_statements(link(self.rows)))
            sql.run_batch(self.after)
            return
        with sql.pipeline() as cursor:
            for text, params in head:
                cursor.execute(text, params)
            if self.inserts:
                # A cursor of its own: one that ran the updates too may hand back an update's result.
                with closing(sql.pipelined_cursor()) as inserted:
                    inserted.execute(*insert_statement(self.inserts, returning=("id",)))
                    keys = inserted.fetchall()  # the first round trip
                for instance, (pk,) in zip(self.inserts, keys, strict=True):
                    rows.mark_saved(instance, pk)
            if self.rows:
                cursor.execute(*insert_statement(link(self.rows)))
            for text, params in self.after:
                cursor.execute(text, params)
            notify = sql.statement("notify")
            for queue in sorted(self.notify):
                cursor.execute(notify, [channel, queue])
            for workflow_id in sorted(self.ended):
                cursor.execute(notify, [f"{channel}_ended", workflow_id])


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
