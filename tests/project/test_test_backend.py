"""The tests' database backend (``tests/backend``): its flush leaves every table as Django's would, truncating fewer.

A table is truncated when a test changed it: it holds pages, or statistics taken since its last
truncation. Every other table is already empty, with no pages and no statistics, as a
``TRUNCATE`` would leave it.
"""

import pytest
from django.core.management import call_command
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import connection

from pgbus_workflows.models import WorkflowRun
from tests.testapp.workflows import NoOp3

pytestmark = pytest.mark.django_db(transaction=True)


def truncated():
    [statement] = sql_flush(no_style(), connection, reset_sequences=False) or ["TRUNCATE ;"]
    names = statement.removeprefix("TRUNCATE ").removesuffix(" CASCADE;").removesuffix(";")
    return {name.strip('"') for name in names.split(", ") if name}


def changed_tables():
    """The app's tables as the planner sees them: those with pages or statistics."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r' "
            "AND relname NOT IN ('django_migrations', 'django_content_type', 'auth_permission') "
            "AND (pg_relation_size(oid) > 0 OR reltuples >= 0)"
        )
        return {name for (name,) in cursor.fetchall()}


def flush():
    call_command("flush", verbosity=0, interactive=False)


def test_a_flush_truncates_the_tables_written_and_leaves_them_as_django_s_would():
    flush()
    assert changed_tables() == set()
    NoOp3.start()
    written = changed_tables()
    assert {WorkflowRun._meta.db_table, "pgbus_workflows_workflowstep"} <= written
    assert written <= truncated()
    flush()
    assert changed_tables() == set()
    assert not WorkflowRun.objects.exists()


def test_a_table_vacuumed_while_empty_is_truncated_for_its_statistics():
    flush()
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {WorkflowRun._meta.db_table}")
    assert truncated() == {WorkflowRun._meta.db_table}
    flush()
    assert changed_tables() == set()


def test_the_content_types_and_permissions_are_kept_and_written_back_if_a_test_deleted_them():
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    kept = set(Permission.objects.values_list("pk", flat=True))
    assert kept
    flush()
    assert set(Permission.objects.values_list("pk", flat=True)) == kept
    ContentType.objects.filter(app_label="pgbus_workflows").delete()
    flush()
    assert ContentType.objects.filter(app_label="pgbus_workflows", model="workflowrun").exists()
    assert Permission.objects.filter(codename="view_workflowrun").exists()
