"""The fast loop's promise (docs/development.md): a test that starts a process is marked ``processes``.

The markers are set on the tests; ``tests/conftest.py`` fails a test that starts a process
unmarked and stops the collection at a test whose file name says a kind it lacks; here a pytest
of its own runs probes that do so, and lists what the fast loop selects.
"""

import os
import subprocess
import sys

import pytest

from tests.procs import ROOT
from tests.project.test_readme_notes import PYTEST_ALONE, connection_url

pytestmark = pytest.mark.processes

FAST = "not processes and not browser and not slow"


def pytest_alone(*args: str, probe: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": connection_url("pgbus_marker_check")}  # no test here touches it
    if probe:
        env["PGBUS_MARKER_PROBE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_ALONE, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_test_that_starts_a_process_unmarked_fails_naming_the_marker():
    run = pytest_alone("tests/marker_probe.py", probe=True)

    assert run.returncode == 1, run.stdout + run.stderr
    assert "starts a process" in run.stdout and "is not marked 'processes'" in run.stdout, run.stdout


def test_an_unmarked_test_in_a_processes_module_stops_the_collection_naming_it():
    run = pytest_alone("--collect-only", "tests/marker_probe_processes.py")

    assert run.returncode == 4, run.stdout + run.stderr  # pytest's usage error
    assert "marker_probe_processes.py::test_probe_in_a_processes_module_unmarked: mark it 'processes'" in run.stderr


@pytest.fixture(scope="module")
def fast_loop() -> subprocess.CompletedProcess:
    """What the fast loop collects (collected once: the suite takes seconds to collect)."""
    return pytest_alone("--collect-only", "-m", FAST, "tests")


def test_the_fast_loop_leaves_out_every_test_of_processes_chromium_and_the_long_harnesses(fast_loop):
    assert fast_loop.returncode == 0, fast_loop.stdout + fast_loop.stderr
    selected = fast_loop.stdout
    for left_out in ("test_chaos.py", "test_state_machine.py", "test_admin_browser.py", "test_fanout_processes.py"):
        assert left_out not in selected, left_out
    assert "test_dispatcher.py::test_the_commands_logs_go_to_the_projects_handlers" not in selected
    assert "tests/services/test_start.py::" in selected  # an in-process module stays


def test_the_fast_loop_runs_about_nine_tests_in_ten(fast_loop):
    """docs/development.md: "Leaving them out runs about nine tests in ten, the in-process ones"."""
    fast = fast_loop
    everything = pytest_alone("--collect-only", "tests")

    def collected(run: subprocess.CompletedProcess) -> int:
        assert run.returncode == 0, run.stdout + run.stderr
        return sum(1 for line in run.stdout.splitlines() if "::" in line)

    share = collected(fast) / collected(everything)
    assert 0.85 <= share <= 0.95, share
