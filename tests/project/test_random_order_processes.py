"""The suite's random order (docs/development.md): a new order each run, its seed printed, an order replayed by it.

pytest-randomly (a dev extra) shuffles every run that does not say ``-p no:randomly``, as
CI's runs of ``bash scripts/test`` do; ``tests/conftest.py`` repeats the seed after the results,
where ``-q`` leaves it. Here a pytest of its own lists one module's tests in the orders seeds give.
"""

import os
import re
import subprocess
import sys

import pytest

from tests.procs import ROOT
from tests.project.test_readme_notes import connection_url

pytestmark = [pytest.mark.processes]

MODULE = "tests/services/test_start.py"


def collected(*args: str) -> tuple[list[str], str]:
    """The module's test ids in the order a pytest run with ``args`` takes them, and its output."""
    env = {**os.environ, "DATABASE_URL": connection_url("pgbus_random_order_check")}  # collection touches none
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only", *args, MODULE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return [line for line in run.stdout.splitlines() if "::" in line], run.stdout


def test_a_run_is_in_a_random_order_whose_seed_it_prints_and_that_seed_replays_it():
    order, output = collected()
    [seed] = re.findall(r"random order: replay with -p randomly --randomly-seed=(\d+)", output)

    assert collected("-p", "randomly", f"--randomly-seed={seed}")[0] == order
    file_order = collected("-p", "no:randomly")[0]
    assert sorted(order) == sorted(file_order)
    assert collected("-p", "randomly", "--randomly-seed=1")[0] != collected("-p", "randomly", "--randomly-seed=2")[0]
