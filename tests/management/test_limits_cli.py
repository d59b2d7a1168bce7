"""``manage.py workflows limits``: the busy keys, their room now and the steps they hold back, as text and JSON."""

from __future__ import annotations

import json

import pytest

from pgbus_workflows.models import WorkflowLimiter
from pgbus_workflows.services.claims import claim_due_steps
from tests.management.test_cli import cli, refusal
from tests.support import staff_user
from tests.testapp.limited_workflows import KeyedSleeper

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy():
    """``account:busy``: its one slot in use and 3 steps parked; ``account:two``: 1 of 2 in use; an idle key."""
    for _ in range(4):
        KeyedSleeper.start(account="busy", seconds=0)
    assert len(claim_due_steps(10, queues=["keyed"], claimed_by="test")) == 1
    WorkflowLimiter.objects.create(name="concurrency:account:two", kind="concurrency", limit=2, in_use=1)
    WorkflowLimiter.objects.create(name="concurrency:account:idle", kind="concurrency", limit=2)


def test_limits_prints_the_busy_keys_most_held_back_first_with_their_room(busy):
    out, _err = cli("limits")

    assert out.splitlines() == [
        "LIMITER                   ROOM NOW       HELD BACK",
        "concurrency:account:busy  1 of 1 in use  3",
        "concurrency:account:two   1 of 2 in use  0",
    ]


def test_limits_json_is_the_mcp_tools_report_with_every_key_shown(busy):
    report = json.loads(cli("limits", "--json", "--limit", "1")[0])

    assert report["limiters"] == [
        {"kind": "concurrency", "key": "account:busy", "limit": 1, "in_use": 1, "held_back": 3, "fixed_key": False}
    ]
    assert (report["busy"], report["more"], report["held_back"]) == (2, True, 3)
    assert "... and 1 more (--limit)" in cli("limits", "--limit", "1")[0]


def test_limits_says_when_nothing_is_busy_and_refuses_a_bad_limit():
    assert cli("limits")[0].strip() == "No limiter is in use or holds a step back."
    assert "must be from 1 to 100, got 101" in refusal("limits", "--limit", "101")


def test_as_a_user_limits_needs_the_permission_to_view_limiters(django_user_model, busy):
    staff_user(django_user_model, "nora", "view_workflowrun")

    assert refusal("limits", "--as-user", "nora") == "nora may not view workflow limiters"
