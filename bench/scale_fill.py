"""Tens of millions of rows written fast: runs the engine made, copied in SQL with their rows.

``bench.scale`` needs 10,000,000 finished runs; the public API would take hours to write them.
So a few template runs are made by the engine itself (``start()`` and the test helpers' real
executor), and each is copied ``count`` times with ``generate_series``: its run row, its
attempts and its events, every column as the engine wrote it but the keys, the
identifiers and the times. The copies are therefore the rows the API writes, whatever the
engine writes next release; ``check_copies`` compares them with their template.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: Copies made per statement: a transaction of a million runs (and their attempts and events) at most.
CHUNK = 1_000_000


@dataclass(frozen=True)
class Copies:
    """Where the copies of one template run go: ``count`` runs of ``workflow_class``, their times spread.

    The template's times move so that copy ``g`` (1..count) ended (or last moved) ``spread * g /
    count`` before now; with ``due_in_seconds``, its scheduled attempt is due that long after now,
    plus ``g`` seconds (runs waiting days for their next step).
    """

    template_pk: int
    count: int
    workflow_class: str
    spread_seconds: float
    due_in_seconds: float | None = None


def _columns(model: Any) -> list[tuple[str, bool]]:
    """(column, is a time) of ``model``'s concrete fields but its primary key."""
    from django.db import models

    return [
        (field.column, isinstance(field, models.DateTimeField))
        for field in model._meta.concrete_fields
        if not field.primary_key
    ]


def _insert(cursor: Any, model: Any, overrides: dict[str, str], source: str, params: dict[str, Any]) -> None:
    """``INSERT INTO model's table (id, every column) SELECT ... FROM source``: ``t`` is the template row.

    A time column moves by ``shift`` (a column of ``source``) unless ``overrides`` names it.
    """
    names, values = ["id"], [overrides["id"]]
    for column, is_time in _columns(model):
        names.append(column)
        values.append(overrides.get(column, f"t.{column} + shift" if is_time else f"t.{column}"))
    cursor.execute(
        f"INSERT INTO {model._meta.db_table} ({', '.join(names)}) SELECT {', '.join(values)} FROM {source}",
        params,
    )


def _next_id(cursor: Any, table: str) -> int:
    cursor.execute(f"SELECT COALESCE(MAX(id), 0) + 1 FROM {table}")
    return int(cursor.fetchone()[0])


def _reset_sequence(cursor: Any, table: str) -> None:
    cursor.execute(
        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT COALESCE(MAX(id), 1) FROM {table}))"
    )


def copy_run(copies: Copies) -> float:
    """Write ``copies.count`` copies of the template run (chunks of :data:`CHUNK`); returns seconds."""
    from django.db import connection, transaction

    from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep

    began = time.perf_counter()
    tables = {m: m._meta.db_table for m in (WorkflowRun, WorkflowStep, WorkflowEvent)}
    # Signals and jobs point at steps and steps at signals: a template has neither, so ids map simply.
    if (
        WorkflowSignal.objects.filter(run_id=copies.template_pk).exists()
        or FanOutJob.objects.filter(run_id=copies.template_pk).exists()
    ):
        raise ValueError(f"run {copies.template_pk} has signals or jobs: a template must have neither")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {tables[WorkflowStep]} WHERE run_id = %s ORDER BY id", [copies.template_pk])
        step_ids = [row[0] for row in cursor.fetchall()]
        cursor.execute(f"SELECT id FROM {tables[WorkflowEvent]} WHERE run_id = %s ORDER BY id", [copies.template_pk])
        event_ids = [row[0] for row in cursor.fetchall()]
    for first in range(1, copies.count + 1, CHUNK):
        last = min(first + CHUNK - 1, copies.count)
        with transaction.atomic(), connection.cursor() as cursor:
            run_base = _next_id(cursor, tables[WorkflowRun])
            step_base = _next_id(cursor, tables[WorkflowStep])
            event_base = _next_id(cursor, tables[WorkflowEvent])
            params = {
                "template": copies.template_pk,
                "first": first,
                "last": last,
                "count": copies.count,
                "spread": copies.spread_seconds,
                "due_in": copies.due_in_seconds,
                "run_base": run_base,
                "step_base": step_base,
                "steps": len(step_ids),
                "step_ids": step_ids,
                "event_base": event_base,
                "events": len(event_ids),
                "event_ids": event_ids,
                "klass": copies.workflow_class,
            }
            # Copy g ends spread * g / count before now: every time of the template moves alike.
            series = f"""
                (SELECT g, now() - interval '1 second' * %(spread)s * g / %(count)s
                        - (SELECT COALESCE(finished_at, status_changed_at) FROM {tables[WorkflowRun]}
                           WHERE id = %(template)s) AS shift
                 FROM generate_series(%(first)s, %(last)s) AS g) AS s"""
            run_id = "%(run_base)s + s.g - %(first)s"
            _insert(
                cursor,
                WorkflowRun,
                {
                    "id": run_id,
                    "workflow_id": "gen_random_uuid()",
                    "workflow_class": "%(klass)s",
                    "idempotency_key": "NULL",
                    "subject_id": "CASE WHEN t.subject_id IS NULL THEN NULL ELSE t.subject_id || '-' || s.g END",
                },
                f"{tables[WorkflowRun]} t CROSS JOIN {series} WHERE t.id = %(template)s",
                params,
            )
            due = {}
            if copies.due_in_seconds is not None:
                due["scheduled_at"] = (
                    "CASE WHEN t.status = 'scheduled' THEN now() + interval '1 second' * (%(due_in)s + s.g)"
                    " ELSE t.scheduled_at + shift END"
                )
            step_id = "%(step_base)s + (s.g - %(first)s) * %(steps)s + m.n - 1"
            _insert(
                cursor,
                WorkflowStep,
                {"id": step_id, "run_id": run_id} | due,
                f"""{tables[WorkflowStep]} t
                    JOIN unnest(%(step_ids)s::bigint[]) WITH ORDINALITY AS m(old, n) ON m.old = t.id
                    CROSS JOIN {series}""",
                params,
            )
            step_of = (
                "%(step_base)s + (s.g - %(first)s) * %(steps)s + array_position(%(step_ids)s::bigint[], t.step_id) - 1"
            )
            _insert(
                cursor,
                WorkflowEvent,
                {
                    # Numbered as the template's are, so that each copy's events keep their order.
                    "id": "%(event_base)s + (s.g - %(first)s) * %(events)s + m.n - 1",
                    "run_id": run_id,
                    "step_id": f"CASE WHEN t.step_id IS NULL THEN NULL ELSE {step_of} END",
                },
                f"""{tables[WorkflowEvent]} t
                    JOIN unnest(%(event_ids)s::bigint[]) WITH ORDINALITY AS m(old, n) ON m.old = t.id
                    CROSS JOIN {series}""",
                params,
            )
            for table in tables.values():
                _reset_sequence(cursor, table)
    return time.perf_counter() - began


@contextmanager
def bulk_load(models: Iterable[Any]) -> Iterator[None]:
    """The tables of ``models`` filled with their declared indexes dropped and their triggers off, then indexed again.

    Building an index once over ten million rows is many times quicker than keeping it row by
    row, and the foreign keys' checks (triggers) cost a lookup a row. Nothing is left unchecked
    that could be wrong: a copy's keys point at rows its own statements wrote (``check_copies``
    reads copies back), the primary keys and unique columns stay, and every index dropped (the
    models' ``Meta.indexes`` and partial unique constraints) is built again by Django's schema
    editor, as its migration built it, its uniqueness checked then. Needs a superuser
    (``DISABLE TRIGGER ALL``).
    """
    from django.db import connection
    from django.db.models import UniqueConstraint

    models = list(models)
    # (model, index or partial unique constraint, whether a constraint)
    declared = [(model, index, False) for model in models for index in model._meta.indexes]
    declared += [
        (model, constraint, True)
        for model in models
        for constraint in model._meta.constraints
        if isinstance(constraint, UniqueConstraint) and constraint.condition is not None
    ]
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # checks pending in a transaction run before the ALTER
    with connection.schema_editor(atomic=False) as editor:
        for model, index, constraint in declared:
            (editor.remove_constraint if constraint else editor.remove_index)(model, index)
        for model in models:
            editor.execute(f"ALTER TABLE {model._meta.db_table} DISABLE TRIGGER ALL")
    try:
        yield
    finally:
        with connection.schema_editor(atomic=False) as editor:
            for model in models:
                editor.execute(f"ALTER TABLE {model._meta.db_table} ENABLE TRIGGER ALL")
            editor.execute("SET maintenance_work_mem = '512MB'")
            for model, index, constraint in declared:
                (editor.add_constraint if constraint else editor.add_index)(model, index)
            editor.execute("RESET maintenance_work_mem")


def check_copies(template_pk: int, workflow_class: str) -> None:
    """Raise unless a copy has the template's attempts (names, statuses, outputs) and events (kinds, in order)."""
    from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep

    template = WorkflowRun.objects.get(pk=template_pk)
    copy = WorkflowRun.objects.filter(workflow_class=workflow_class).exclude(pk=template_pk).order_by("-pk").first()
    if copy is None:
        raise AssertionError(f"no copy of run {template_pk} as {workflow_class}")

    def attempts(run: WorkflowRun) -> list[tuple[Any, ...]]:
        rows = WorkflowStep.objects.filter(run=run).order_by("pk")
        return list(rows.values_list("step_name", "attempt", "status", "outcome", "output"))

    def events(run: WorkflowRun) -> list[tuple[Any, ...]]:
        rows = WorkflowEvent.objects.filter(run=run).order_by("pk")
        return [(kind, step is not None) for kind, step in rows.values_list("kind", "step__step_name")]

    for read in (attempts, events):
        if read(template) != read(copy):
            raise AssertionError(f"run {copy.pk} is no copy of {template_pk}: {read(copy)} != {read(template)}")
    if (copy.status, copy.current_step) != (template.status, template.current_step):
        raise AssertionError(f"run {copy.pk}: {copy.status}/{copy.current_step}, not the template's")
