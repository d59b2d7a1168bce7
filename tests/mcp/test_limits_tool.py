"""The ``limits`` read tool through the SDK's client: the busy keys, busiest first, capped, redacted, fitted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from pgbus_workflows.models import WorkflowLimiter
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.sql import clock
from tests.mcp.session import answer, tool_error
from tests.support import staff_user
from tests.testapp.limited_workflows import KeyedSleeper

pytestmark = pytest.mark.django_db

SHOWN = override_settings(PGBUS_WORKFLOWS={"MCP_SHOW_PAYLOADS": True})


@pytest.fixture
def busy():
    """``account:busy``: its one slot in use, 4 steps held back (3 parked, 1 not yet); ``proc-rate``'s
    bucket emptied (a fixed key, 5 a second); ``account:idle``: a key with room, holding nothing."""
    for _ in range(4):
        KeyedSleeper.start(account="busy", seconds=0)
    assert len(claim_due_steps(10, queues=["keyed"], claimed_by="test")) == 1
    KeyedSleeper.start(account="busy", seconds=0)
    WorkflowLimiter.objects.create(name="concurrency:account:idle", kind="concurrency", limit=3)
    WorkflowLimiter.objects.create(
        name="rate:proc-rate", kind="rate", limit=5, per=timedelta(seconds=10), tokens=0.0, refilled_at=clock.now()
    )


@SHOWN
def test_limits_lists_the_busy_keys_most_held_back_first_with_their_room_now(busy):
    found = answer("limits")

    assert (found["busy"], found["more"], found["held_back"]) == (2, False, 4)
    first, second = found["limiters"]
    assert first == {
        "kind": "concurrency",
        "key": "account:busy",
        "limit": 1,
        "in_use": 1,
        "held_back": 4,
        "fixed_key": False,
    }
    assert (second["kind"], second["key"], second["tokens"], second["held_back"]) == ("rate", "proc-rate", 0, 0)
    assert second["per_seconds"] == 10.0 and 0 < second["next_token_in_seconds"] <= 2.0  # one token every 2 s
    assert second["fixed_key"] is True


@SHOWN
def test_limits_sorts_by_use_filters_by_kind_and_caps_the_rows(busy):
    by_use = answer("limits", {"order": "in_use"})["limiters"]
    assert [row["key"] for row in by_use] == ["proc-rate", "account:busy"]  # 5 tokens spent, before 1 slot

    assert [row["key"] for row in answer("limits", {"kind": "rate"})["limiters"]] == ["proc-rate"]

    capped = answer("limits", {"limit": 1})
    assert ([row["key"] for row in capped["limiters"]], capped["busy"], capped["more"]) == (["account:busy"], 2, True)


def test_a_key_computed_from_a_runs_arguments_is_redacted_a_fixed_key_shown(busy):
    found = answer("limits")

    assert found["limiters"][0]["key"].startswith("[redacted")
    assert "busy" not in str(found["limiters"][0])
    assert found["limiters"][1]["key"] == "proc-rate"


def test_limits_caps_its_arguments():
    assert "limit" in tool_error("limits", {"limit": 101})
    assert "order must be one of held_back, in_use; got 'size'" in tool_error("limits", {"order": "size"})
    assert "kind must be one of concurrency, rate; got 'queue'" in tool_error("limits", {"kind": "queue"})


def test_as_a_user_limits_needs_the_permission_to_view_limiters(django_user_model, busy):
    staff_user(django_user_model, "nora", "view_workflowrun")
    staff_user(django_user_model, "lina", "view_workflowrun", "view_workflowlimiter")

    assert tool_error("limits", as_user="nora").endswith("nora may not view workflow limiters")
    assert answer("limits", as_user="lina")["busy"] == 2


@override_settings(PGBUS_WORKFLOWS={"MCP_SHOW_PAYLOADS": True, "MCP_MAX_RESPONSE_BYTES": 6000})
def test_long_keys_are_cut_to_fit_the_byte_cap_and_every_row_stays():
    for n in range(20):
        WorkflowLimiter.objects.create(name=f"concurrency:{n:03}{'k' * 250}", kind="concurrency", limit=1, in_use=1)

    found = answer("limits", {"limit": 20})

    assert len(found["limiters"]) == 20 and found["busy"] == 20
    cut = [row["key"] for row in found["limiters"] if row["key"].startswith("[cut to fit")]
    assert 0 < len(cut) < 20 and all(row["in_use"] == 1 for row in found["limiters"])
