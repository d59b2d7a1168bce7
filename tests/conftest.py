"""Shared fixtures, the test kinds' markers, and the random order's seed repeated at the end of the run.

Every test that starts a process (a dispatcher, ``manage.py``, pytest, PgBouncer) is marked
``processes``, every one that drives Chromium ``browser``, the long harnesses ``slow``: the
fast loop, ``bash scripts/test -m "not processes and not browser and not slow"``, leaves
them out. The markers are given here, from the fixtures a test asks for and the module it
is in, and they are kept true: a test not marked ``processes`` or ``browser`` that starts a
process fails, naming the marker it lacks.
"""

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from pgbus_workflows import sql
from pgbus_workflows.dsl.declared import registry
from tests.procs import DispatcherProcess
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
def remove_limits(monkeypatch):
    """Take every ``Concurrency`` and ``RateLimit`` out of the project's code, as a deploy that removes the last one."""

    def remove() -> None:
        for cls in registry.classes():
            monkeypatch.setattr(cls, "concurrency", None, raising=False)
            monkeypatch.setattr(cls, "rate_limit", None, raising=False)
            bare = tuple(replace(d, concurrency=None, rate_limit=None) for d in cls._step_definitions)
            monkeypatch.setattr(cls, "_step_definitions", bare)
        monkeypatch.setattr(registry, "version", registry.version + 1)

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


#: Modules whose every test starts processes (beyond those named ``*_processes.py``).
PROCESS_MODULES = {
    "test_chaos",
    "test_state_machine",
    "test_pgbouncer",
    "test_sqlite_smoke",
    "test_checks_sqlite",
    "test_cli_failures",
    "test_deploy_checks_fresh",
    "test_markers",
}
#: Tests that start processes in modules of mostly in-process tests (``module::name``, parameters aside).
PROCESS_TESTS = {
    "test_claims::test_a_dispatcher_waits_quietly_beside_a_due_step_it_cannot_run",
    "test_cli_schedules::test_a_real_process_exits_0_when_done_and_1_with_one_line_when_refused",
    "test_dispatcher::test_the_commands_logs_go_to_the_projects_handlers_or_else_to_its_stdout",
    "test_dispatcher_signals::test_a_sigterm_during_the_first_heartbeat_leaves_no_dispatcher_row",
    "test_dispatcher_signals::test_a_sigterm_at_any_line_of_the_loops_round_stops_the_dispatcher",
    "test_metrics::test_without_prometheus_client_the_app_works_and_the_module_names_the_extra",
    "test_metrics::test_a_bad_metrics_port_is_refused_by_the_command_line",
    "test_readme_notes::test_the_browser_tests_are_skipped_without_chromium",
    "test_registry_and_settings::test_the_simple_app_config_does_not_discover",
    "test_registry_and_settings::test_autodiscovery_imports_each_app_s_workflows_module_at_setup",
    "test_registry_and_settings::test_autodiscover_module_none_turns_discovery_off",
    "test_tracing::test_without_either_extra_runs_start_and_run_and_save_no_context",
    "test_wakeups::test_when_the_first_dies_a_follower_takes_the_work_and_when_it_stops_another_is_first",
}
#: Fixtures that start processes.
PROCESS_FIXTURES = {"dispatchers", "pgbouncer", "two_dispatchers"}
#: Modules of the long harnesses (minutes each): the chaos runs and the state machine's property test.
SLOW_MODULES = {"test_chaos", "test_state_machine"}


def pytest_collection_modifyitems(config, items):
    """Mark each test with its kind: ``browser``, ``processes`` (and ``slow``)."""
    for item in items:
        module = Path(str(item.fspath)).stem
        if module.endswith("_browser"):
            item.add_marker(pytest.mark.browser)
        if (
            module.endswith("_processes")
            or module in PROCESS_MODULES
            or f"{module}::{item.originalname}" in PROCESS_TESTS
            or PROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.processes)
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_process_unless_marked(request, monkeypatch):
    """A test that starts a process without the ``processes`` (or ``browser``) marker fails: the fast loop runs it."""
    if request.node.get_closest_marker("processes") or request.node.get_closest_marker("browser"):
        return

    def refuse(self, args, *rest, **kwargs):
        raise AssertionError(
            f"{request.node.nodeid} starts a process ({args!r}) but is not marked 'processes': "
            "add its module or fixture to tests/conftest.py"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Repeat pytest-randomly's seed after the results (its header line is hidden by ``-q``)."""
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.getoption("randomly_seed")
        terminalreporter.write_line(f"random order: replay with -p randomly --randomly-seed={seed}")
