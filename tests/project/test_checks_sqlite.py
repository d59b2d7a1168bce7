"""The SQLite system checks (W002: several dispatchers; W003: deferred transactions).

The suite runs on PostgreSQL, where both checks stay silent; their SQLite logic is tested
here through a stand-in connection (the Dispatcher rows still come from the test database),
and for real on SQLite in test_sqlite_smoke.py.
"""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core import checks as django_checks
from django.db import connection
from django.utils import timezone

from pgbus_workflows import checks
from pgbus_workflows.models import Dispatcher

pytestmark = pytest.mark.processes


def sqlite_connection(name=":memory:", tables=("pgbus_workflows_dispatcher",), options=None):
    return SimpleNamespace(
        vendor="sqlite",
        settings_dict={"NAME": name, "OPTIONS": options if options is not None else {}},
        introspection=SimpleNamespace(table_names=lambda: list(tables)),
    )


@pytest.fixture
def on_sqlite(monkeypatch):
    def use(**kwargs):
        monkeypatch.setattr(checks, "connections", {"default": sqlite_connection(**kwargs)})

    return use


def dispatcher(name, seconds_ago=0):
    return Dispatcher.objects.create(
        name=name, hostname="h", pid=1, heartbeat_at=timezone.now() - timedelta(seconds=seconds_ago)
    )


@pytest.mark.django_db
def test_postgresql_never_warns_even_with_several_dispatchers():
    if connection.vendor != "postgresql":
        pytest.skip("the suite runs on PostgreSQL")
    dispatcher("a")
    dispatcher("b")
    assert checks.check_sqlite_dispatchers() == []
    assert checks.check_sqlite_transaction_mode() == []


@pytest.mark.django_db
def test_two_fresh_dispatchers_on_sqlite_warn(on_sqlite):
    on_sqlite()
    dispatcher("host:1")
    dispatcher("host:2")
    [warning] = checks.check_sqlite_dispatchers()
    assert warning.id == "pgbus_workflows.W002"
    assert warning.level == django_checks.WARNING
    assert "host:1" in warning.msg
    assert "host:2" in warning.msg


@pytest.mark.django_db
def test_one_dispatcher_or_a_dead_one_does_not_warn(on_sqlite):
    on_sqlite()
    dispatcher("alive")
    assert checks.check_sqlite_dispatchers() == []
    dispatcher("dead", seconds_ago=3600)  # older than DISPATCHER_DEAD_AFTER
    assert checks.check_sqlite_dispatchers() == []


def test_an_unmigrated_sqlite_database_does_not_warn(on_sqlite):
    on_sqlite(tables=())
    assert checks.check_sqlite_dispatchers() == []


def test_no_database_access_is_no_warning(on_sqlite):
    """pytest-django blocks the database in tests without the ``db`` fixture: the check keeps quiet."""
    on_sqlite()
    assert checks.check_sqlite_dispatchers() == []


def test_a_missing_sqlite_file_is_not_opened(on_sqlite, tmp_path):
    on_sqlite(name=str(tmp_path / "db.sqlite3"), tables=None)  # table_names() would raise
    assert checks.check_sqlite_dispatchers() == []


@pytest.mark.parametrize("mode", [None, "DEFERRED", "deferred"])
def test_deferred_sqlite_transactions_warn(on_sqlite, mode):
    on_sqlite(options={} if mode is None else {"transaction_mode": mode})
    [warning] = checks.check_sqlite_transaction_mode()
    assert warning.id == "pgbus_workflows.W003"
    assert "IMMEDIATE" in warning.hint


@pytest.mark.parametrize("mode", ["IMMEDIATE", "EXCLUSIVE", "immediate"])
def test_immediate_sqlite_transactions_do_not_warn(on_sqlite, mode):
    on_sqlite(options={"transaction_mode": mode})
    assert checks.check_sqlite_transaction_mode() == []


def test_both_checks_run_with_a_plain_manage_py_check():
    """Not tagged ``database``: those only run with ``check --database``."""
    registered = django_checks.registry.registry.get_checks()
    for check in (checks.check_sqlite_dispatchers, checks.check_sqlite_transaction_mode):
        assert check in registered
        assert django_checks.Tags.database not in check.tags
