"""``manage.py workflows show``: long values are cut in the text, and ``--full`` prints them whole."""

import pytest

from pgbus_workflows.operating.terminal import MAX_CELL
from pgbus_workflows.testing import WorkflowTestMixin
from tests.management.test_cli import cli, ready, wid
from tests.testapp.workflows import Squares

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()

HINT = "Values longer than 60 characters end in '...': show --full prints them whole."


def test_a_long_pause_reason_is_cut_and_full_prints_it_whole():
    reason = "the carrier's API answers 503 for every parcel to the islands; " * 4
    wf = ready()
    wf.pause(actor="alice", reason=reason)
    out, _err = cli("show", wid(wf))
    line = next(line for line in out.splitlines() if "paused because" in line)
    assert line.endswith("...") and len(line.split("paused because", 1)[1].strip()) == MAX_CELL
    assert out.splitlines()[-1] == HINT
    full, _err = cli("show", wid(wf), "--full")
    assert f"paused because   {' '.join(reason.split())}" in full
    assert HINT not in full


def test_the_fan_out_summary_fits_and_full_cuts_nothing():
    wf = helpers.perform_next_step(Squares.start(count=1200))
    out, _err = cli("show", wid(wf))
    assert "fan-out 0/1200 done, 0 failed, 0 cancelled, 1200 pending" in out
    assert HINT not in out
    full, _err = cli("show", wid(wf), "--full")
    assert "fan-out 0/1200 done, 0 failed, 0 cancelled, 1200 pending" in full
    assert "..." not in full
