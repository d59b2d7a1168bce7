"""``check --database default`` on a database without the app's tables says nothing (no rows to compare).

``migrate`` runs the system checks before it makes the tables: on a fresh database (the
demo's first command) the deploy checks used to print W005 with a raw "relation does not
exist" error.
"""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from pgbus_workflows.deploy_checks import check_rows_against_code
from pgbus_workflows.models import WorkflowRun

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_the_deploy_checks_say_nothing_on_a_database_without_the_tables():
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{WorkflowRun._meta.db_table}" RENAME TO pgbus_wf_run_not_yet')
        assert check_rows_against_code(databases=["default"]) == []
    # The test's transaction rolls back: the table is back.


def _migrate(database_url):
    """``manage.py migrate`` of the example project on ``database_url``, in a process of its own: its output."""
    env = {**os.environ, "DATABASE_URL": database_url}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_migrate_on_a_fresh_sqlite_file_prints_no_w005(tmp_path):
    output = _migrate(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert "Applying pgbus_workflows.0001_initial... OK" in output
    assert "W005" not in output and "no such table" not in output, output


def test_migrate_on_a_fresh_postgresql_database_prints_no_w005():
    server = connection.settings_dict
    name = f"pgbus_wf_fresh_{uuid.uuid4().hex[:12]}"
    params = {"host": server["HOST"], "port": server["PORT"] or 5432, "user": server["USER"], "dbname": "postgres"}
    password = f":{server['PASSWORD']}" if server.get("PASSWORD") else ""
    if password:
        params["password"] = server["PASSWORD"]
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        output = _migrate(f"postgres://{server['USER']}{password}@{server['HOST']}:{params['port']}/{name}")
    finally:
        with psycopg.connect(**params, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    assert "Applying pgbus_workflows.0001_initial... OK" in output
    assert "W005" not in output and "does not exist" not in output, output
