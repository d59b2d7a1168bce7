"""Counts that cost no scan of a large table: bounded, estimated, or read off an index.

- :func:`distinct_values`: the values of an index's leading column, one index probe each (a
  "loose index scan" as a recursive query), instead of ``SELECT DISTINCT`` over the table.
- :func:`bounded_count`: how many rows match, counting at most ``limit + 1`` of them.
- :func:`planner_estimate`: the planner's row estimate for a queryset (``EXPLAIN``; it comes
  from ``pg_class.reltuples`` and the column statistics ``ANALYZE`` keeps).
- :func:`estimated_count`: exact up to a limit, the planner's estimate above it.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connections, router
from django.db.models import Model, QuerySet

#: Up to this many matching rows a count is exact; above it, the planner's estimate.
EXACT_UP_TO = 1000


def distinct_values(model: type[Model], field: str, using: str | None = None) -> list[Any]:
    """The distinct non-null values of ``model.field``, in order.

    ``field`` must lead an index of the table: each value is then one probe of that index
    ("the smallest value above the last one"), so the cost grows with the number of values,
    not with the number of rows.
    """
    opts = model._meta
    connection = connections[using or str(router.db_for_read(model))]
    quote = connection.ops.quote_name
    table, column = quote(opts.db_table), quote(opts.get_field(field).column)  # type: ignore[union-attr,arg-type]
    query = (
        f"WITH RECURSIVE loose(v) AS ("  # noqa: S608 - names from model metadata only
        f"SELECT MIN({column}) FROM {table} "
        f"UNION ALL SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > loose.v) FROM loose "
        f"WHERE loose.v IS NOT NULL) SELECT v FROM loose WHERE v IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(query)
        return [row[0] for row in cursor.fetchall()]


def bounded_count(queryset: QuerySet[Any], limit: int) -> int:
    """How many rows ``queryset`` has, counting no more than ``limit + 1`` of them."""
    return queryset[: limit + 1].count()


def planner_estimate(queryset: QuerySet[Any]) -> int:
    """The planner's estimate of the rows ``queryset`` returns (PostgreSQL; an exact count elsewhere)."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return queryset.count()
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
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
