"""Is this app's schema migrated? One clear line instead of a traceback when it is not.

Checked when a dispatcher starts, and by ``start()`` only after a statement failed (the
happy path pays nothing): a missing table or column becomes :class:`NotMigrated`.
"""

from __future__ import annotations

from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from .exceptions import NotMigrated

APP_LABEL = "pgbus_workflows"


def unapplied_migrations(using: str = "default") -> list[str]:
    """This app's migrations the database has not applied, in the order ``migrate`` would apply them."""

    executor = MigrationExecutor(connections[using])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
    plan = executor.migration_plan(targets)
    return [f"{migration.app_label}.{migration.name}" for migration, backwards in plan if not backwards]


def message(missing: list[str]) -> str:
    """The one line: what is missing and the command that fixes it."""
    listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return f"The database lacks pgbus_workflows migrations ({listed}): run `python manage.py migrate`"


def require_migrated(using: str = "default") -> None:
    """Raise :class:`NotMigrated` when some of this app's migrations are not applied."""
    missing = unapplied_migrations(using)
    if missing:
        raise NotMigrated(message(missing))


#: SQLSTATEs of a statement naming a table or a column the schema lacks.
_UNDEFINED = ("42P01", "42703")


def explain(error: DatabaseError, using: str = "default") -> NotMigrated | None:
    """:class:`NotMigrated` when ``error`` came from a schema that lacks tables or columns, else None.

    Inside the caller's transaction (aborted by the error) the migrations cannot be listed:
    the line then names none, but still says what to run.
    """
    cause = error.__cause__
    code = getattr(cause, "sqlstate", None) or getattr(getattr(cause, "diag", None), "sqlstate", None)
    text = str(error)
    undefined = code in _UNDEFINED or "no such table" in text or "no such column" in text
    if not undefined:
        return None
    if connections[using].in_atomic_block:
        return NotMigrated(
            f"The database lacks pgbus_workflows tables or columns ({text.strip().splitlines()[0]}): "
            "run `python manage.py migrate`"
        )
    try:
        missing = unapplied_migrations(using)
    except DatabaseError:
        missing = []
    return NotMigrated(message(missing)) if missing else None
