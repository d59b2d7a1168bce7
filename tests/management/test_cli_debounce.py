"""``manage.py workflows show`` of a debounced run: its debounce key, and each collapse in its events."""

import json
from datetime import timedelta

import pytest

from pgbus_workflows import Debounce, Workflow, step
from tests.management.test_cli import cli, ready, wid
from tests.support import events_of

pytestmark = pytest.mark.django_db


class PushAccount(Workflow):
    """Debounced per account: the second start collapses into the first one's run."""

    name = "cli_debounce_push"
    allow_multiple = True
    step_options = {"queue": "cli_debounce"}
    debounce = Debounce(period=timedelta(seconds=30), key=lambda wf: f"account:{wf.arguments['account_id']}")

    @step
    def push(self):
        return None


def test_show_prints_the_debounce_key_and_each_collapse_with_the_first_steps_old_and_new_time():
    wf = PushAccount.start(account_id=1, note="a")
    PushAccount.start(account_id=1, note="b")
    [event] = events_of(wf, "debounced")

    out, _err = cli("show", wid(wf))
    assert "  debounce key     account:1" in out.splitlines()
    events = out[out.index("Events") :].splitlines()
    [line] = [line for line in events if " debounced " in line]
    assert line.endswith(event.reason)
    assert event.reason.startswith("push moved from ") and event.reason.endswith(" UTC")

    page = json.loads(cli("show", wid(wf), "--json")[0])
    assert page["run"]["debounce_key"] == "account:1"
    [shown] = [e for e in page["events"] if e["kind"] == "debounced"]
    assert shown["reason"] == event.reason
    assert shown["details"]["arguments"] == {"account_id": 1, "note": "b"}
    assert set(shown["details"]) >= {"previous_scheduled_at", "scheduled_at"}


def test_show_prints_no_debounce_key_for_a_run_without_one():
    wf = ready()
    out, _err = cli("show", wid(wf))
    assert "debounce key" not in out
    assert json.loads(cli("show", wid(wf), "--json")[0])["run"]["debounce_key"] is None
