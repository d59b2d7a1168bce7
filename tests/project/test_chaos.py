"""The chaos harness in its short mode: dispatchers SIGKILLed while 100 runs go on; nothing is lost."""

import pytest

from bench.chaos import FAULTS, run_chaos
from tests.procs import LIBFAKETIME, database_url

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_short_chaos_run_with_a_schedule_keeps_every_promise(tmp_path):
    report = run_chaos(
        database_url(), runs=100, dispatchers=3, kill_every=1.5, timeout=240, logs=tmp_path, schedule=True
    )

    assert report.kills >= 1, "the harness must actually kill dispatchers"
    assert report.violations == [], report.summary()
    assert report.statuses == {"finished": 100}
    assert report.ticks >= 3, report.summary()  # every tick once, none lost: checked into violations


def test_short_chaos_run_with_every_fault_inside_the_process_keeps_every_promise(tmp_path):
    faults = frozenset(FAULTS if LIBFAKETIME is not None else set(FAULTS) - {"skew"})
    report = run_chaos(database_url(), runs=60, dispatchers=3, kill_every=2, timeout=240, logs=tmp_path, faults=faults)

    assert report.kills >= 1
    assert report.violations == [], report.summary()
    assert report.statuses == {"finished": 60}
    assert report.faults["exit"] == report.faults["nul"] == 12 and report.faults["hang"] == 3


def test_short_chaos_run_of_a_durable_function_keeps_every_promise(tmp_path):
    report = run_chaos(
        database_url(), runs=0, dispatchers=2, kill_every=3, timeout=240, logs=tmp_path, durable=20, max_kills=8
    )

    assert report.kills >= 1, "the harness must actually kill dispatchers"
    assert report.violations == [], report.summary()
    assert report.statuses == {} and report.durable == 20
