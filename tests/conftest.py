"""Shared fixtures, and the random order's seed repeated at the end of the run."""

import pytest

from tests.procs import DispatcherProcess
from tests.testapp.models import Order


@pytest.fixture
def order(db):
    """A saved Order to be the subject of a run."""
    return Order.objects.create()


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


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Repeat pytest-randomly's seed after the results (its header line is hidden by ``-q``)."""
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.getoption("randomly_seed")
        terminalreporter.write_line(f"random order: replay with -p randomly --randomly-seed={seed}")
