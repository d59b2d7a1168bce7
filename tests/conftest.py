"""Shared fixtures, the test kinds' markers, and the random order's seed repeated at the end of the run.

Every test that starts a process (a dispatcher, ``manage.py``, pytest, PgBouncer) is marked
``processes``, every one that drives Chromium ``browser``, the long harnesses ``slow``: the
fast loop, ``bash scripts/test -m "not processes and not browser and not slow"``, leaves
them out. The markers are set on the tests themselves (``pytestmark`` in a module, a decorator
on a test) and kept true here: a test not marked ``processes`` or ``browser`` that starts a
process fails, naming the marker it lacks, and collection stops at a test whose file name
(``*_processes.py``, ``*_browser.py``) or fixtures say a kind it is not marked with.
"""

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from django.db import connection

from pgbus_workflows import sql
from pgbus_workflows.dsl.declared import registry
from tests.procs import DispatcherProcess
from tests.support import changed_classes
from tests.testapp.models import Order


@pytest.fixture(autouse=True)
def _prepares_nothing_after():
    """Each test leaves the process preparing nothing, as a web process starts.

    An in-process dispatcher's LISTEN connection lets every connection of the process to its
    server prepare (``sql.prepare_statements``), and a connection remembers the answer
    (``sql._preparing``): left in place, a later test's statement ran prepared, and Django's
    query log records no text for a prepared statement.
    """
    yield
    sql._prepared_at.clear()
    sql._preparing.clear()


@pytest.fixture
def order(db):
    """A saved Order to be the subject of a run."""
    return Order.objects.create()


@pytest.fixture
def executed_plans():
    """The plans of the statements the block executes on Django's connection (``auto_explain``, sent as notices)."""
    plans: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        cursor.execute("SET auto_explain.log_min_duration = 0")
        cursor.execute("SET auto_explain.log_level = 'notice'")
        cursor.execute("SET auto_explain.log_settings = on")  # the planner settings that differ from the defaults

    def handler(notice):
        plans.append(notice.message_primary)

    connection.connection.add_notice_handler(handler)
    try:
        yield plans
    finally:
        connection.connection.remove_notice_handler(handler)
        with connection.cursor() as cursor:
            cursor.execute("RESET auto_explain.log_min_duration")
            cursor.execute("RESET auto_explain.log_level")
            cursor.execute("RESET auto_explain.log_settings")
            cursor.execute("RESET auto_explain.log_format")


@pytest.fixture
def change_classes():
    """``change_classes(cls, name, value)``: a class attribute changed until the test ends (``changed_classes``)."""
    with changed_classes() as change:
        yield change


@pytest.fixture
def remove_limits(change_classes):
    """Take every ``Concurrency`` and ``RateLimit`` out of the project's code, as a deploy that removes the last one."""

    def remove() -> None:
        for cls in registry.classes():
            change_classes(cls, "concurrency", None)
            change_classes(cls, "rate_limit", None)
            bare = tuple(replace(d, concurrency=None, rate_limit=None) for d in cls._step_definitions)
            change_classes(cls, "_step_definitions", bare)

    return remove


@pytest.fixture
def dispatchers():
    """Start dispatcher processes; every one is killed before the database is flushed."""
    started = []

    def start(*args, settings=None, env=None):
        process = DispatcherProcess(*args, settings=settings, env=env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


#: Fixtures that start processes: a test that asks for one is marked ``processes``.
PROCESS_FIXTURES = {"dispatchers", "pgbouncer", "two_dispatchers"}


def pytest_collection_modifyitems(config, items):
    """Refuse a test whose marker its file's name or its fixtures contradict (the markers are set on the tests).

    A ``*_processes.py`` module's tests and a test asking for a fixture that starts processes carry
    ``processes``, a ``*_browser.py`` module's carry ``browser``: a missing marker would run them
    in the fast loop, so collection stops and names them.
    """
    unmarked = []
    for item in items:
        module = Path(str(item.fspath)).stem
        if module.endswith("_browser") and not item.get_closest_marker("browser"):
            unmarked.append(f"{item.nodeid}: mark it 'browser'")
        wants_processes = module.endswith("_processes") or PROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))
        if wants_processes and not item.get_closest_marker("processes"):
            unmarked.append(f"{item.nodeid}: mark it 'processes'")
    if unmarked:
        raise pytest.UsageError("tests without the marker of their kind:\n" + "\n".join(unmarked))


@pytest.fixture(autouse=True)
def _no_process_unless_marked(request, monkeypatch):
    """A test that starts a process without the ``processes`` (or ``browser``) marker fails: the fast loop runs it."""
    if request.node.get_closest_marker("processes") or request.node.get_closest_marker("browser"):
        return

    def refuse(self, args, *rest, **kwargs):
        raise AssertionError(
            f"{request.node.nodeid} starts a process ({args!r}) but is not marked 'processes': "
            "add `@pytest.mark.processes` to it (or `pytestmark = pytest.mark.processes` to its module)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Repeat pytest-randomly's seed after the results (its header line is hidden by ``-q``)."""
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.getoption("randomly_seed")
        terminalreporter.write_line(f"random order: replay with -p randomly --randomly-seed={seed}")
