"""``start()``'s function is trusted by its owner and its schema, never by its name.

A role that may create objects in a schema (every role on ``public`` before PostgreSQL 15)
could plant a function of the start function's name: called with the application's rights,
it may do anything they allow (here: grant itself ``DELETE`` on the runs table). These
tests plant one as another role, before ``migrate`` and after it, and hold that it never
runs, that starts go on, and that ``migrate`` and ``check --database default`` name it.
"""

import pytest
from django.core import management
from django.db import connection

from pgbus_workflows import Workflow, step
from pgbus_workflows.deploy_checks import check_rows_against_code
from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.sql import functions
from tests.testapp.models import Order

#: The role that plants a function (created in each test's transaction, gone with its rollback).
PLANTER = "pgbus_wf_planter"
RUNS = WorkflowRun._meta.db_table


class PlantedStart(Workflow):
    name = "planted_start"

    @step
    def only(self):
        return None


@pytest.fixture
def planter():
    """The planting role, allowed to create in ``public`` (as every role was before PostgreSQL 15)."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {PLANTER} NOLOGIN")
        cursor.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {PLANTER}")
    if connection.connection is not None:
        functions.forget(connection.connection)  # as new to start(): another test's starts may have found ours
    return PLANTER
    # The test's transaction rolls back: the role, its grants and what it planted are gone.


def _drop_ours():
    """Drop this code's function wherever it is (as a database whose role could not create it would lack it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT oid::regprocedure::text FROM pg_proc WHERE proname = %s", [functions.function_name(connection)]
        )
        for (signature,) in cursor.fetchall():
            cursor.execute(f"DROP FUNCTION {signature}")


def _plant(schema):
    """As the planter, a function of this code's name and arguments in ``schema`` that grants it DELETE on the runs."""
    name = f"{schema}.{functions.function_name(connection)}"
    grant = f"EXECUTE 'GRANT DELETE ON {RUNS} TO {PLANTER}'; "
    planted = functions._definition(connection).replace("{name}", name).replace(" BEGIN ", f" BEGIN {grant}", 1)
    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {PLANTER}")
        try:
            cursor.execute(planted)
        finally:
            cursor.execute("RESET ROLE")
    return name


def _planted_ran():
    with connection.cursor() as cursor:
        cursor.execute("SELECT has_table_privilege(%s, %s, 'DELETE')", [PLANTER, RUNS])
        return cursor.fetchone()[0]


def _start_many():
    """Starts past the point where a connection calls the function; each wrote its run."""
    count = functions.THRESHOLD + 3
    handles = [PlantedStart.start(Order.objects.create()) for _ in range(count)]
    assert WorkflowRun.objects.filter(pk__in=[wf.record.pk for wf in handles]).count() == count


@pytest.mark.django_db
def test_a_function_planted_before_migrate_is_never_called_and_is_named(planter, caplog):
    """Planted in the tables' schema before ``install()``: not replaced, not called, named in a warning."""
    _drop_ours()
    planted = _plant("public")
    assert functions.install() is False
    _start_many()
    assert not _planted_ran()
    assert f"{planted} (owner {PLANTER})" in caplog.text
    assert functions.installed_name() is None
    warnings = [m for m in check_rows_against_code(databases=["default"]) if m.id == "pgbus_workflows.W011"]
    assert len(warnings) == 1 and f"{planted} (owner {PLANTER})" in warnings[0].msg


@pytest.mark.django_db
def test_migrate_with_a_planted_function_warns_and_succeeds(planter, caplog):
    """``migrate`` (its ``post_migrate`` installs the function) logs the planted one and does not fail."""
    _drop_ours()
    planted = _plant("public")
    management.call_command("migrate", "pgbus_workflows", verbosity=0, skip_checks=True)
    assert f"{planted} (owner {PLANTER})" in caplog.text
    _start_many()
    assert not _planted_ran()


@pytest.mark.django_db
def test_a_function_planted_after_migrate_earlier_on_the_search_path_is_never_called(planter, caplog):
    """The default search_path begins with ``"$user"``: a schema named after the role, made by another, comes first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user, current_database()")
        user, database = cursor.fetchone()
        cursor.execute(f"GRANT CREATE ON DATABASE {connection.ops.quote_name(database)} TO {PLANTER}")
        cursor.execute('SET LOCAL search_path = "$user", public')
        cursor.execute(f"SET ROLE {PLANTER}")
        cursor.execute(f"CREATE SCHEMA {connection.ops.quote_name(user)}")
        cursor.execute("RESET ROLE")
    planted = _plant(user)
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regproc(%s)::oid = %s::regproc::oid", [functions.function_name(connection), planted])
        assert cursor.fetchone()[0]  # the planted one is what the bare name finds
    assert functions.installed_name() is not None  # ours, from migrate, is still there
    _start_many()
    assert not _planted_ran()
    warnings = [m for m in check_rows_against_code(databases=["default"]) if m.id == "pgbus_workflows.W011"]
    assert len(warnings) == 1 and f"{planted} (owner {PLANTER})" in warnings[0].msg


@pytest.mark.django_db
def test_a_function_planted_after_migrate_in_the_tables_schema_is_never_called(planter):
    """Ours is missing (a role that could not create it): one planted later where it belongs is not called either."""
    _drop_ours()
    _start_many()  # the connection looked and found none
    _plant("public")
    functions.forget(connection.connection)  # it looks again (as it does after RECHECK_SECONDS)
    _start_many()
    assert not _planted_ran()


@pytest.mark.django_db
def test_migrate_as_another_role_than_the_tables_owner_gives_the_function_to_that_owner():
    """The tables belong to another role than the one that migrates: the function is made theirs, and called."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE ROLE pgbus_wf_owner NOLOGIN")
        cursor.execute("GRANT USAGE, CREATE ON SCHEMA public TO pgbus_wf_owner")
        cursor.execute(f"ALTER TABLE {RUNS} OWNER TO pgbus_wf_owner")
    _drop_ours()
    assert functions.install() is True
    name = functions.installed_name()
    assert name == f"public.{functions.function_name(connection)}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_userbyid(proowner) FROM pg_proc WHERE oid = %s::regproc", [name])
        assert cursor.fetchone()[0] == "pgbus_wf_owner"
    functions.forget(connection.connection)
    _start_many()
    assert functions.start_path(connection.connection) == (name, False)  # the connection calls it now
    # The test's transaction rolls back: the role is gone, the table root's again, the function as it was.


@pytest.mark.django_db
def test_a_function_planted_between_the_look_and_the_create_is_a_warning_not_a_failure(planter, caplog, monkeypatch):
    """``CREATE OR REPLACE`` of a function another role owns fails ("must be owner"): logged, and migrate goes on."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE ROLE pgbus_wf_migrator NOLOGIN")
        cursor.execute("GRANT USAGE, CREATE ON SCHEMA public TO pgbus_wf_migrator")
        cursor.execute(f"ALTER TABLE {RUNS} OWNER TO pgbus_wf_migrator")
    _drop_ours()
    _plant("public")
    monkeypatch.setattr(functions, "_functions", lambda cursor, conn: [])  # planted after install() looked
    with connection.cursor() as cursor:
        cursor.execute("SET ROLE pgbus_wf_migrator")
        try:
            assert functions.install() is False
        finally:
            cursor.execute("RESET ROLE")
    assert "Could not create start()'s function" in caplog.text and "must be owner" in caplog.text
    _start_many()
    assert not _planted_ran()


@pytest.mark.django_db
def test_a_superuser_migrate_that_replaces_a_function_planted_meanwhile_takes_it_from_its_planter(planter, monkeypatch):
    """A superuser's ``CREATE OR REPLACE`` succeeds on another role's function: the function is then given to the
    tables' owner, so the planter may not change it again, and start() calls it."""
    _drop_ours()
    _plant("public")
    monkeypatch.setattr(functions, "_functions", lambda cursor, conn: [])  # planted after install() looked
    assert functions.install() is True
    monkeypatch.undo()
    assert functions.installed_name() == f"public.{functions.function_name(connection)}"
    _start_many()
    assert not _planted_ran()
