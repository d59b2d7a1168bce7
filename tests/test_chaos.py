"""The chaos harness in its short mode: dispatchers SIGKILLed while 100 runs go on; nothing is lost."""

import pytest

from bench.chaos import run_chaos
from tests.procs import database_url

pytestmark = pytest.mark.django_db(transaction=True)


def test_short_chaos_run_keeps_every_promise(tmp_path):
    report = run_chaos(database_url(), runs=100, dispatchers=3, kill_every=1.5, timeout=240, logs=tmp_path)

    assert report.kills >= 1, "the harness must actually kill dispatchers"
    assert report.violations == [], report.summary()
    assert report.statuses == {"finished": 100}
