"""The live schema keeps the models' promises: read from pg_index and pg_constraint after migrate.

``makemigrations --check`` compares migration state with the models; these compare the
database itself, so an index a migration lost (as the first 0002 lost
``pgbus_wf_one_active_step_per_run``) fails here.
"""

import importlib
import uuid

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction

from pgbus_workflows import schema
from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from tests.testapp.workflows import Approval, Counted, Squares

pytestmark = pytest.mark.django_db(transaction=True)

MODELS = list(apps.get_app_config("pgbus_workflows").get_models())


def test_every_declared_index_constraint_and_on_delete_is_in_the_live_database():
    assert schema.differences(connection, MODELS) == []


def test_the_comparison_sees_a_lost_index():
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX pgbus_wf_one_active_step_per_run")
    try:
        found = [str(d) for d in schema.differences(connection, MODELS)]
        assert found == ["pgbus_workflows_workflowstep.pgbus_wf_one_active_step_per_run: index missing"]
    finally:
        with connection.schema_editor(atomic=False) as editor:
            assert schema.restore_declared(editor, MODELS) == ["pgbus_wf_one_active_step_per_run"]
    assert schema.differences(connection, MODELS) == []


def test_the_comparison_sees_an_index_on_other_columns():
    # The due index as it was before 0011 (priority, scheduled_at, id): same name, same predicate.
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX pgbus_wf_step_due")
        cursor.execute(
            "CREATE INDEX pgbus_wf_step_due ON pgbus_workflows_workflowstep (priority, scheduled_at, id) "
            "WHERE status = 'scheduled'"
        )
    try:
        found = [str(d) for d in schema.differences(connection, MODELS)]
        assert found == [
            "pgbus_workflows_workflowstep.pgbus_wf_step_due: index columns differ: (priority, scheduled_at, id)"
        ]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX pgbus_wf_step_due")
        with connection.schema_editor(atomic=False) as editor:
            assert schema.restore_declared(editor, MODELS) == ["pgbus_wf_step_due"]
    assert schema.differences(connection, MODELS) == []


def test_the_due_index_swap_runs_both_ways_and_picks_up_where_a_failed_run_stopped():
    swap = importlib.import_module("pgbus_workflows.migrations.0027_due_time_statistics")  # the latest swap
    with connection.schema_editor(atomic=False) as editor:
        swap.backwards(apps, editor)  # migrating back to 0026
    assert [str(d) for d in schema.differences(connection, MODELS)] == [
        "pgbus_workflows_workflowstep.pgbus_wf_step_due: index columns differ:"
        " (priority, held, parked, scheduled_at, id)",
        "pgbus_workflows_workflowstep.pgbus_wf_step_due_at: statistics missing",
    ]
    interim = swap.NEW_DUE.clone()
    interim.name = "pgbus_wf_step_due_next"
    with connection.schema_editor(atomic=False) as editor:
        schema.create_index(editor, WorkflowStep, interim)  # a run that stopped once it had built the new one
        swap.forwards(apps, editor)
    assert schema.differences(connection, MODELS) == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_class WHERE relname = 'pgbus_wf_step_due_next'")
        assert cursor.fetchone() == (0,)
        cursor.execute("SELECT pg_get_indexdef('pgbus_wf_step_due'::regclass)")
        assert "THEN scheduled_at" in cursor.fetchone()[0]


def test_the_pipeline_index_swap_runs_both_ways():
    swap = importlib.import_module("pgbus_workflows.migrations.0025_run_hours")
    with connection.schema_editor(atomic=False) as editor:
        schema.replace_index(editor, WorkflowRun, swap.NEW_PIPELINE, swap.OLD_PIPELINE)  # migrating back to 0024
    assert [str(d) for d in schema.differences(connection, MODELS)] == [
        "pgbus_workflows_workflowrun.pgbus_wf_run_pipeline: index columns differ:"
        " (workflow_class, current_step, status)"
    ]
    with connection.schema_editor(atomic=False) as editor:
        schema.replace_index(editor, WorkflowRun, swap.OLD_PIPELINE, swap.NEW_PIPELINE)
    assert schema.differences(connection, MODELS) == []


def test_a_step_inserted_by_code_older_than_held_is_not_held():
    # A rolling deploy: code from before 0011 inserts steps without the column; the database's
    # default stands in for it, and the step is claimable as it always was.
    Counted.start()
    row = WorkflowStep.objects.get()
    fields = [f for f in WorkflowStep._meta.concrete_fields if not f.primary_key and f.attname != "held"]
    values = [f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    WorkflowStep.objects.all().delete()
    with transaction.atomic(), connection.cursor() as cursor:
        placeholders = ", ".join(["%s"] * len(fields))
        cursor.execute(f"INSERT INTO {WorkflowStep._meta.db_table} ({columns}) VALUES ({placeholders})", values)
    assert WorkflowStep.objects.get().held is False
    (claimed,) = claim_due_steps(5, claimed_by="d")
    assert claimed.step_name == row.step_name


def insert_copy(row, **changes):
    """INSERT a copy of ``row`` with ``changes``, in raw SQL as a DBA's script would."""
    model = type(row)
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    values = [changes.get(f.attname, f.get_db_prep_save(getattr(row, f.attname), connection)) for f in fields]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {model._meta.db_table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})", values
        )


def test_postgresql_itself_refuses_a_second_active_step_for_a_run():
    wf = Counted.start()
    step = WorkflowStep.objects.get(run=wf.record)

    with pytest.raises(IntegrityError, match="pgbus_wf_one_active_step_per_run"):
        insert_copy(step, step_name="second", status="in_progress")
    insert_copy(step, step_name="second", status="completed")  # ended attempts are not limited


def test_postgresql_itself_refuses_a_second_ongoing_run_for_a_subject(order):
    wf = Counted.start(order)

    with pytest.raises(IntegrityError, match="pgbus_wf_one_ongoing_per_subject"):
        insert_copy(wf.record, workflow_id=uuid.uuid4())
    insert_copy(wf.record, workflow_id=uuid.uuid4(), status="finished")  # finished runs do not count


def test_a_plain_delete_of_a_run_cascades_in_the_database():
    fan = Squares.start(count=2)
    claimed = claim_due_steps(10, claimed_by="t")
    for step in claimed:
        execute_step(step)
    waiting = Approval.start()
    waiting.signal("approved")
    runs = [fan.record.pk, waiting.record.pk]
    assert FanOutJob.objects.filter(run_id__in=runs).exists() and WorkflowSignal.objects.exists()

    with connection.cursor() as cursor:  # an ops script's DELETE, no ORM collector
        cursor.execute(f"DELETE FROM {WorkflowRun._meta.db_table} WHERE id = ANY(%s)", [runs])

    for model in (WorkflowStep, WorkflowEvent, WorkflowSignal, FanOutJob):
        assert not model.objects.filter(run_id__in=runs).exists(), model.__name__


def test_restoring_a_unique_index_the_rows_break_says_which_and_leaves_no_invalid_index():
    wf = Counted.start()
    step = WorkflowStep.objects.get(run=wf.record)
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX pgbus_wf_one_active_step_per_run")
    insert_copy(step, step_name="second", status="scheduled")  # what nothing refused meanwhile
    try:
        with connection.schema_editor(atomic=False) as editor, pytest.raises(RuntimeError, match="extra attempts"):
            schema.restore_declared(editor, MODELS)
        assert [d.problem for d in schema.differences(connection, MODELS)] == ["index missing"]
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == "0"  # the session's own setting again
    finally:
        WorkflowStep.objects.filter(run=wf.record, step_name="second").delete()
        with connection.schema_editor(atomic=False) as editor:
            schema.restore_declared(editor, MODELS)
    assert schema.differences(connection, MODELS) == []


def test_a_migration_step_gives_up_on_a_lock_rather_than_queueing_behind_a_long_transaction(monkeypatch):
    import psycopg
    from django.db import OperationalError

    from pgbus_workflows.sql.session import connection_params

    monkeypatch.setattr(schema, "LOCK_TIMEOUT", "200ms")  # the 10 s of a real migration, shortened
    with connection.schema_editor(atomic=False) as editor:
        schema.enforce_on_delete(editor, MODELS, enforce=False)  # something left to do
    try:
        with psycopg.connect(**connection_params()) as other:
            other.execute(f"LOCK TABLE {WorkflowStep._meta.db_table} IN ACCESS EXCLUSIVE MODE")
            with connection.schema_editor(atomic=False) as editor, pytest.raises(OperationalError, match="lock"):
                schema.enforce_on_delete(editor, MODELS)
    finally:
        with connection.schema_editor(atomic=False) as editor:
            schema.enforce_on_delete(editor, MODELS)
    assert schema.differences(connection, MODELS) == []
