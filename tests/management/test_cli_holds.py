"""``manage.py workflows hold|release|holds``: holding a class or a queue from a terminal."""

import json

import pytest

from pgbus_workflows.models import WorkflowHold
from tests.management.test_cli import SHELL_ACTOR, cli, refusal
from tests.support import staff_user

pytestmark = pytest.mark.django_db


def test_hold_a_class_list_it_and_release_it_with_actor_and_reason_recorded():
    out, _ = cli("hold", "held_work", "--reason", "mail down")
    assert out.startswith("class held_work held since ") and out.strip().endswith(f"by {SHELL_ACTOR}: mail down")

    rows = json.loads(cli("holds", "--json")[0])
    assert [(r["kind"], r["name"], r["held_by"], r["reason"]) for r in rows] == [
        ("class", "held_work", SHELL_ACTOR, "mail down")
    ]
    assert "class held_work held since" in cli("holds")[0]

    out, _ = cli("release", "held_work", "--actor", "ops", "--reason", "back")
    assert out.startswith("class held_work released (held since")
    hold = WorkflowHold.objects.get()
    assert (hold.released_by, hold.release_reason) == ("ops", "back")
    assert cli("holds")[0].strip() == "Nothing is held."
    assert cli("release", "held_work")[0].strip() == "class held_work was not held"


def test_hold_and_release_a_queue():
    cli("hold", "--queue", "held", "--reason", "failover")
    assert WorkflowHold.objects.active().get().name == "held"
    assert json.loads(cli("release", "--queue", "held", "--json")[0])["released"] is True


def test_bad_targets_are_refused_in_one_line():
    assert "No workflow class is registered as 'nope'" in refusal("hold", "nope")
    assert "A queue name is a non-empty string" in refusal("hold", "--queue", "")
    assert "argument --queue: not allowed with argument CLASS" in refusal("hold", "held_work", "--queue", "held")
    assert not WorkflowHold.objects.exists()


def test_as_user_needs_the_hold_permission(django_user_model):
    staff_user(django_user_model, "viewer", "view_workflowrun")
    staff_user(django_user_model, "holder", "view_workflowrun", "hold_workflowrun")

    assert "viewer may not hold or release (permission pgbus_workflows.hold_workflowrun)" in refusal(
        "hold", "held_work", "--as-user", "viewer"
    )
    cli("hold", "held_work", "--as-user", "holder", "--reason", "x")
    assert WorkflowHold.objects.active().get().held_by == "holder"
    assert "held_work" in cli("holds", "--as-user", "viewer")[0]
