"""Counts that cost no scan of a large table: bounded, estimated, or read off an index.

- :func:`distinct_values`: the values of an index's leading column, one index probe each (a
  "loose index scan" as a recursive query), instead of ``SELECT DISTINCT`` over the table.
- :func:`bounded_count`: how many rows match, counting at most ``limit + 1`` of them.
- :func:`planner_estimate`: the planner's row estimate for a queryset (``EXPLAIN``; it comes
  from ``pg_class.reltuples`` and the column statistics ``ANALYZE`` keeps).
- :func:`estimated_count`: exact up to a limit, the planner's estimate above it.
- :func:`bounded_pair_counts`: rows per (class, status), each count stopping at a limit.
- :func:`oldest_due_at`: when the longest-waiting due step became due, a few probes of the due index.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db.models import Model, QuerySet

from . import cursor, postgresql

#: Up to this many matching rows a count is exact; above it, the planner's estimate.
EXACT_UP_TO = 1000


def _read_alias(model: type[Model]) -> str:
    """The alias a read of ``model`` goes to here (``READ_DATABASE`` inside ``models.reading.reading``)."""
    return str(model._default_manager.all().db)


def distinct_values(model: type[Model], field: str) -> list[Any]:
    """The distinct non-null values of ``model.field``, in order.

    ``field`` must lead an index of the table: each value is then one probe of that index
    ("the smallest value above the last one"), so the cost grows with the number of values,
    not with the number of rows.
    """
    opts = model._meta
    with cursor(_read_alias(model)) as django_cursor:
        quote = django_cursor.db.ops.quote_name
        table, column = quote(opts.db_table), quote(opts.get_field(field).column)  # type: ignore[union-attr]
        django_cursor.execute(
            f"WITH RECURSIVE loose(v) AS (SELECT MIN({column}) FROM {table} "
            f"UNION ALL SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > loose.v) FROM loose "
            "WHERE loose.v IS NOT NULL) SELECT v FROM loose WHERE v IS NOT NULL"
        )
        return [row[0] for row in django_cursor.fetchall()]


def bounded_count(queryset: QuerySet[Any], limit: int) -> int:
    """How many rows ``queryset`` has, counting no more than ``limit + 1`` of them."""
    return queryset[: limit + 1].count()


def planner_estimate(queryset: QuerySet[Any]) -> int:
    """The planner's estimate of the rows ``queryset`` returns (PostgreSQL; an exact count elsewhere)."""
    if not postgresql():
        return queryset.count()
    sql, params = queryset.query.sql_with_params()
    with cursor(queryset.db) as django_cursor:
        django_cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = django_cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def estimated_count(queryset: QuerySet[Any], exact_up_to: int = EXACT_UP_TO) -> tuple[int, bool]:
    """``(count, estimated)``: the exact count up to ``exact_up_to``, else the planner's estimate.

    The exact part counts in the queryset's own order, so an ordered changelist walks the
    index its page uses and stops after ``exact_up_to + 1`` rows. An estimate is never
    reported below what was counted.
    """
    counted = bounded_count(queryset, exact_up_to)
    if counted <= exact_up_to:
        return counted, False
    return max(planner_estimate(queryset), counted), True


def bounded_pair_counts(
    model: type[Model], values: tuple[list[str], list[str]], limit: int
) -> dict[tuple[str, str], int]:
    """``{(class, status): rows}`` of ``model`` for every pair of ``values``, each counted up to
    ``limit + 1`` rows in the (workflow_class, status) index, in one statement (PostgreSQL).

    Pairs without rows are left out.
    """
    classes, statuses = values
    with cursor(_read_alias(model)) as django_cursor:
        table = django_cursor.db.ops.quote_name(model._meta.db_table)
        django_cursor.execute(
            f"SELECT c.k, s.v, (SELECT COUNT(*) FROM (SELECT 1 FROM {table} r "
            "WHERE r.workflow_class = c.k AND r.status = s.v LIMIT %s) AS bounded) "
            "FROM unnest(%s::text[]) AS c(k) CROSS JOIN unnest(%s::text[]) AS s(v)",
            [limit + 1, classes, statuses],
        )
        return {(klass, status): n for klass, status, n in django_cursor.fetchall() if n}


def oldest_due_at(now: datetime) -> datetime | None:
    """The ``scheduled_at`` of the longest-waiting attempt due at ``now``, not held nor parked (None: nothing is).

    On PostgreSQL, one probe of the due index (``pgbus_wf_step_due``: priority, ``held``,
    ``parked``, due time, ``sql.due``) per priority in use, as the claim reads it: the steps waiting
    for later are never walked. Attempts a full limit parked are left out (the health report
    counts them as held back).
    """
    from ..models import WorkflowStep  # deferred: the models import the sql package
    from ..states import StepStatus

    due = WorkflowStep.objects.filter(status=StepStatus.SCHEDULED, held=False, parked=False, scheduled_at__lte=now)
    if not postgresql():
        return due.order_by("scheduled_at").values_list("scheduled_at", flat=True).first()
    from .due import due_at, due_by

    opts = WorkflowStep._meta
    with cursor(due.db) as django_cursor:
        conn = django_cursor.db
        table = conn.ops.quote_name(opts.db_table)
        status, held, parked, priority = (
            conn.ops.quote_name(opts.get_field(f).column)  # type: ignore[union-attr]
            for f in ("status", "held", "parked", "priority")
        )
        scheduled, at = f"{status} = %s", due_at(conn, table)
        django_cursor.execute(
            f"WITH RECURSIVE priorities(p) AS (SELECT MIN({priority}) FROM {table} WHERE {scheduled} "
            f"UNION ALL SELECT (SELECT MIN({priority}) FROM {table} WHERE {scheduled} AND {priority} > priorities.p) "
            "FROM priorities WHERE priorities.p IS NOT NULL) "
            f"SELECT MIN((SELECT {at} FROM {table} WHERE {scheduled} AND {priority} = priorities.p AND NOT {held} "
            f"AND NOT {parked} AND {due_by(conn, table, '%s')} ORDER BY {at} LIMIT 1)) "
            "FROM priorities WHERE priorities.p IS NOT NULL",
            [StepStatus.SCHEDULED, StepStatus.SCHEDULED, StepStatus.SCHEDULED, now],
        )
        row = django_cursor.fetchone()
    return None if row is None else row[0]
