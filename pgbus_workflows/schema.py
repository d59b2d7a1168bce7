"""The live schema against what the models declare, and the migration steps that mend it online.

Django's migration state can say an index exists when the database has lost it (an ``AlterField``
on a foreign key drops every btree index on that column, ``Meta.constraints`` included, while
the state keeps them). :func:`differences` compares the live database (``pg_index``,
``pg_constraint``) with every index, constraint and foreign-key ``ON DELETE`` the models
declare; the test suite asserts it is empty, and the migrations call :func:`restore_declared`
and :func:`enforce_on_delete`, which change a large table without holding a long lock:
indexes are built ``CONCURRENTLY``, constraints are added ``NOT VALID`` and validated under a
lock that lets reads and writes go on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models.constants import LOOKUP_SEP

#: How long a migration step waits for a lock before it gives up (and says so): it never
#: queues behind a long transaction while blocking everything that comes after it.
LOCK_TIMEOUT = "10s"
#: ``pg_constraint.confdeltype`` for each ``on_delete`` the database enforces itself.
ON_DELETE_CODES = {models.CASCADE: "c", models.SET_NULL: "n"}
#: Extended statistics the claims' plans count on (PostgreSQL 14+; Django declares none, a
#: migration makes them), by model: ``{name: expression}``. See ``sql.due``.
DECLARED_STATISTICS = {
    "pgbus_workflows.workflowstep": {"pgbus_wf_step_due_at": "(CASE WHEN status = 'scheduled' THEN scheduled_at END)"}
}


@dataclass(frozen=True)
class Difference:
    """One thing the models declare that the live database does not have as declared."""

    table: str
    name: str
    problem: str

    def __str__(self) -> str:
        return f"{self.table}.{self.name}: {self.problem}"


def _is_index(item: Any) -> bool:
    """Whether PostgreSQL keeps ``item`` as an index only (no ``pg_constraint`` row)."""
    return isinstance(item, models.Index) or (
        isinstance(item, models.UniqueConstraint) and (item.condition is not None or bool(item.expressions))
    )


def _declared(model: type[models.Model]) -> Iterable[Any]:
    yield from model._meta.indexes
    yield from model._meta.constraints


def differences(connection: Any, app_models: Iterable[type[models.Model]]) -> list[Difference]:
    """What the live database lacks of what ``app_models`` declare (PostgreSQL; [] elsewhere)."""
    if connection.vendor != "postgresql":
        return []
    found = []
    with connection.cursor() as cursor:
        for model in app_models:
            table = model._meta.db_table
            indexes = _live_indexes(cursor, table)
            constraints = _live_constraints(cursor, table)
            for item in _declared(model):
                if _is_index(item):
                    index = indexes.get(item.name)
                    if index is None:
                        found.append(Difference(table, item.name, "index missing"))
                    elif not index[0]:
                        found.append(Difference(table, item.name, "index invalid (a failed concurrent build)"))
                    elif index[1] != isinstance(item, models.UniqueConstraint):
                        found.append(Difference(table, item.name, "index uniqueness differs"))
                    elif index[2] != (item.condition is not None):
                        found.append(Difference(table, item.name, "index predicate differs"))
                    elif (item.fields or item.expressions) and index[3] != _declared_columns(model, item):
                        found.append(Difference(table, item.name, f"index columns differ: ({', '.join(index[3])})"))
                else:
                    constraint = constraints.get(item.name)
                    if constraint is None:
                        found.append(Difference(table, item.name, "constraint missing"))
                    elif not constraint[1]:
                        found.append(Difference(table, item.name, "constraint not validated"))
            found.extend(_on_delete_differences(cursor, model))
            live = _live_statistics(cursor, table)
            found.extend(
                Difference(table, name, "statistics missing")
                for name in DECLARED_STATISTICS.get(model._meta.label_lower, {})
                if name not in live
            )
    return found


def _live_statistics(cursor: Any, table: str) -> set[str]:
    cursor.execute("SELECT stxname FROM pg_statistic_ext WHERE stxrelid = %s::regclass", [table])
    return {name for (name,) in cursor.fetchall()}


def _live_indexes(cursor: Any, table: str) -> dict[str, tuple[bool, bool, bool, list[str]]]:
    """``{name: (valid, unique, partial, columns)}`` of the table's indexes (an expression's column: '')."""
    cursor.execute(
        "SELECT c.relname, i.indisvalid, i.indisunique, i.indpred IS NOT NULL, "
        "ARRAY(SELECT COALESCE(a.attname, '') FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n) "
        "LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n) "
        "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
        [table],
    )
    return {row[0]: (row[1], row[2], row[3], list(row[4])) for row in cursor.fetchall()}


def _declared_columns(model: type[models.Model], item: Any) -> list[str]:
    """The columns of a declared index or constraint, in order (``INCLUDE`` ones last; an expression's: '')."""
    keys = [name.lstrip("-") for name in item.fields] or [_field_name(expression) for expression in item.expressions]
    names = keys + list(getattr(item, "include", None) or ())
    return [str(model._meta.get_field(name).column) if name else "" for name in names]  # type: ignore[union-attr]


def _field_name(expression: Any) -> str | None:
    """The field an index expression names alone (``F("priority")``), or None (any other expression)."""
    name = expression.name if isinstance(expression, models.F) else None  # type: ignore[attr-defined]
    return name if name and LOOKUP_SEP not in name else None


def _live_constraints(cursor: Any, table: str) -> dict[str, tuple[str, bool]]:
    """``{name: (type, validated)}`` of the table's constraints."""
    cursor.execute("SELECT conname, contype, convalidated FROM pg_constraint WHERE conrelid = %s::regclass", [table])
    return {name: (kind, validated) for name, kind, validated in cursor.fetchall()}


def _foreign_keys(cursor: Any, table: str, column: str) -> list[tuple[str, str, bool]]:
    """``[(name, confdeltype, validated)]`` of the foreign keys on ``table.column``."""
    cursor.execute(
        "SELECT c.conname, c.confdeltype, c.convalidated FROM pg_constraint c "
        "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey) "
        "WHERE c.contype = 'f' AND c.conrelid = %s::regclass AND a.attname = %s AND cardinality(c.conkey) = 1",
        [table, column],
    )
    return list(cursor.fetchall())


def _on_delete_differences(cursor: Any, model: type[models.Model]) -> list[Difference]:
    found = []
    table = model._meta.db_table
    for field, code in _enforced_foreign_keys(model):
        keys = _foreign_keys(cursor, table, field.column)
        if not any(action == code and validated for _, action, validated in keys):
            found.append(Difference(table, field.column, f"foreign key without ON DELETE {_action_sql(code)}"))
    return found


def _enforced_foreign_keys(model: type[models.Model]) -> list[tuple[Any, str]]:
    """The model's foreign keys whose ``on_delete`` the database enforces, with its code."""
    keys = []
    for field in model._meta.concrete_fields:
        if isinstance(field, models.ForeignKey) and getattr(field, "db_constraint", True):
            code = ON_DELETE_CODES.get(field.remote_field.on_delete)  # type: ignore[arg-type]
            if code is not None:
                keys.append((field, code))
    return keys


def _action_sql(code: str) -> str:
    return {"c": "CASCADE", "n": "SET NULL", "a": "NO ACTION"}[code]


def restore_declared(schema_editor: Any, app_models: Iterable[type[models.Model]]) -> list[str]:
    """Create what the live database lacks of the declared indexes and constraints; their names.

    On PostgreSQL in a non-atomic migration: indexes ``CONCURRENTLY`` (a leftover invalid
    index of a failed build is dropped first), check constraints ``NOT VALID`` then validated.
    A unique index that the rows already violate is not built: a clear error says which rows.
    """
    connection = schema_editor.connection
    restored = []
    for model in app_models:
        for item in _declared(model):
            if connection.vendor != "postgresql":
                continue  # SQLite builds every declared index and constraint with its tables
            if _restore(schema_editor, model, item):
                restored.append(item.name)
    return restored


def create_statistics(schema_editor: Any, model: type[models.Model], name: str, expression: str) -> bool:
    """Create the extended statistics ``name`` on ``expression`` if missing, then analyse the table; whether created.

    PostgreSQL only (14+: statistics on an expression). ``ANALYZE`` fills them at once, as
    the next autovacuum would: it reads a sample of the table, and lets reads and writes go on.
    """
    if schema_editor.connection.vendor != "postgresql":
        return False
    table, quote = model._meta.db_table, schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor, _lock_timeout(cursor):
        if name in _live_statistics(cursor, table):
            return False
        cursor.execute(f"CREATE STATISTICS {quote(name)} ON {expression} FROM {quote(table)}")
        cursor.execute(f"ANALYZE {quote(table)}")
    return True


def drop_statistics(schema_editor: Any, name: str) -> None:
    """Drop the extended statistics ``name`` if they exist (PostgreSQL)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {schema_editor.quote_name(name)}")


def _restore(schema_editor: Any, model: type[models.Model], item: Any) -> bool:
    table = model._meta.db_table
    quote = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor, _lock_timeout(cursor):
        if isinstance(item, models.UniqueConstraint) and not _is_index(item):
            return _restore_unique(cursor, schema_editor, model, item)
        if _is_index(item):
            state = _live_indexes(cursor, table).get(item.name)
            if state is not None and state[0]:
                return False
            if state is not None:
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote(item.name)}")
            _build_concurrently(cursor, quote, table, item.name, str(item.create_sql(model, schema_editor)))
            return True
        constraint = _live_constraints(cursor, table).get(item.name)
        if constraint is not None and constraint[1]:
            return False
        if constraint is None:
            cursor.execute(f"{item.create_sql(model, schema_editor)} NOT VALID")
        cursor.execute(f"ALTER TABLE {quote(table)} VALIDATE CONSTRAINT {quote(item.name)}")
        return True


def _restore_unique(cursor: Any, schema_editor: Any, model: type[models.Model], item: Any) -> bool:
    """A plain unique constraint: its index built concurrently, then attached (``USING INDEX``)."""
    table = model._meta.db_table
    quote = schema_editor.quote_name
    if item.name in _live_constraints(cursor, table):
        return False
    columns = ", ".join(quote(model._meta.get_field(name).column) for name in item.fields)  # type: ignore[union-attr]
    _build_concurrently(
        cursor, quote, table, item.name, f"CREATE UNIQUE INDEX {quote(item.name)} ON {quote(table)} ({columns})"
    )
    cursor.execute(
        f"ALTER TABLE {quote(table)} ADD CONSTRAINT {quote(item.name)} UNIQUE USING INDEX {quote(item.name)}"
    )
    return True


def _build_concurrently(cursor: Any, quote: Any, table: str, name: str, sql: str) -> None:
    """Run a ``CREATE [UNIQUE] INDEX`` concurrently; on failure, drop the invalid index it leaves."""
    sql = sql.replace("CREATE UNIQUE INDEX", "CREATE UNIQUE INDEX CONCURRENTLY", 1)
    sql = sql.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1)
    try:
        cursor.execute(sql)
    except Exception as error:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote(name)}")
        raise RuntimeError(
            f"Could not build {name} on {table}: {error}. For a unique index, the rows that break it must "
            "be mended first (for pgbus_wf_one_active_step_per_run: runs with more than one scheduled, "
            "in-progress or waiting attempt; cancel the extra attempts), then migrate again."
        ) from error


@contextmanager
def _lock_timeout(cursor: Any) -> Iterator[None]:
    """``lock_timeout`` for the block's statements, then the session's own again."""
    cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    try:
        yield
    finally:
        cursor.execute("RESET lock_timeout")


def drop_indexes(schema_editor: Any, names: Iterable[str]) -> None:
    """Drop indexes by name if they exist (concurrently on PostgreSQL)."""
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    with schema_editor.connection.cursor() as cursor:
        for name in names:
            cursor.execute(f"DROP INDEX{concurrently} IF EXISTS {schema_editor.quote_name(name)}")


def create_index(schema_editor: Any, model: type[models.Model], index: models.Index) -> None:
    """Create ``index`` if it does not exist (concurrently on PostgreSQL, in a non-atomic migration)."""
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.execute(
            str(index.create_sql(model, schema_editor)).replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1)
        )
        return
    with schema_editor.connection.cursor() as cursor, _lock_timeout(cursor):
        if _live_indexes(cursor, model._meta.db_table).get(index.name, (False,))[0]:
            return
        _build_concurrently(
            cursor,
            schema_editor.quote_name,
            model._meta.db_table,
            index.name,
            str(index.create_sql(model, schema_editor)),
        )


def replace_index(schema_editor: Any, model: type[models.Model], old: models.Index, new: models.Index) -> None:
    """Replace ``old`` by ``new``, of the same name, without a moment when neither serves a query.

    On PostgreSQL ``new`` is built ``CONCURRENTLY`` under a name of its own, then ``old`` is
    dropped concurrently and ``new`` takes its name (a rename holds no lock that stops reads
    or writes). Run again after a failure, it picks up where it stopped. SQLite drops and adds.
    """
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(model, old)
        schema_editor.add_index(model, new)
        return
    interim = new.clone()
    interim.name = f"{new.name}_next"
    create_index(schema_editor, model, interim)
    drop_indexes(schema_editor, [old.name])
    quote = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor, _lock_timeout(cursor):
        cursor.execute(f"ALTER INDEX {quote(interim.name)} RENAME TO {quote(new.name)}")


def enforce_on_delete(schema_editor: Any, app_models: Iterable[type[models.Model]], *, enforce: bool = True) -> None:
    """Make the database enforce the foreign keys' ``on_delete`` (``enforce=False``: back to NO ACTION).

    Each key is added anew ``NOT VALID`` (no scan under a strong lock), validated (reads and
    writes go on), and the old one dropped, all deferrable as Django makes them. PostgreSQL only.
    """
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    with connection.cursor() as cursor, _lock_timeout(cursor):
        for model in app_models:
            table = model._meta.db_table
            for field, code in _enforced_foreign_keys(model):
                wanted = code if enforce else "a"
                keys = _foreign_keys(cursor, table, field.column)
                if any(action == wanted and validated for _, action, validated in keys):
                    continue
                target = field.related_model._meta
                name = f"{table[:40]}_{field.column}_{'on_delete' if enforce else 'fk'}"
                action = "" if wanted == "a" else f" ON DELETE {_action_sql(wanted)}"
                cursor.execute(
                    f"ALTER TABLE {quote(table)} ADD CONSTRAINT {quote(name)} FOREIGN KEY ({quote(field.column)}) "
                    f"REFERENCES {quote(target.db_table)} ({quote(target.pk.column)}){action} "
                    "DEFERRABLE INITIALLY DEFERRED NOT VALID"
                )
                cursor.execute(f"ALTER TABLE {quote(table)} VALIDATE CONSTRAINT {quote(name)}")
                for old, _, _ in keys:
                    cursor.execute(f"ALTER TABLE {quote(table)} DROP CONSTRAINT {quote(old)}")


def add_declared(schema_editor: Any, model: type[models.Model], name: str) -> None:
    """Create the declared index or constraint ``name`` of ``model`` on a table that may be large.

    PostgreSQL builds it online (:func:`restore_declared`: ``CONCURRENTLY``, in a non-atomic
    migration); SQLite, where the app's tables are small, adds it as Django would.
    """
    if schema_editor.connection.vendor == "postgresql":
        restore_declared(schema_editor, [model])
        return
    item = next(i for i in _declared(model) if i.name == name)
    if isinstance(item, models.Index):
        schema_editor.add_index(model, item)
    else:
        schema_editor.add_constraint(model, item)
