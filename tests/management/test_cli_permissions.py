"""``manage.py workflows --as-user``: the Django user's permissions, asked as the admin asks them.

The user must be able to enter the admin (active, staff); each run is asked of
``WorkflowRunAdmin.may_operate`` (the verb's permission and the view permission on that
run, object-level backends included), and a refused run is left as it was.
"""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from tests.management.test_cli import cli, paused_on_error, ready, refusal, wid
from tests.support import VIEW, WITHHELD, new_events, snapshot, staff_user
from tests.testapp.permissions import GRANTS

pytestmark = pytest.mark.django_db


def test_as_user_without_the_verbs_permission_is_refused_and_nothing_changes(django_user_model):
    staff_user(django_user_model, "bob", *VIEW)
    wf = ready()
    before = snapshot(wf)
    assert refusal("pause", wid(wf), "--as-user", "bob") == (
        f"{wid(wf)}: bob may not pause it (it needs the permission pgbus_workflows.pause_workflowrun "
        "and the view permission on the run)"
    )
    assert snapshot(wf) == before


def test_as_user_with_the_permission_acts_under_their_username(django_user_model):
    staff_user(django_user_model, "carol", *VIEW, "pause_workflowrun")
    wf = ready()
    before = snapshot(wf)
    cli("pause", wid(wf), "--as-user", "carol", "--reason", "looks odd")
    assert [(e.kind, e.actor, e.reason) for e in new_events(wf, before)] == [("paused", "carol", "looks odd")]

    # resume at a step takes the skip permission, as in the admin
    assert "carol may not resume at it" in refusal("resume", wid(wf), "--at", "two", "--as-user", "carol")
    assert wf.reload().status == "paused"


def test_the_verbs_permission_without_the_view_permission_is_refused(django_user_model):
    staff_user(django_user_model, "dan", "pause_workflowrun")
    wf = ready()
    assert "dan may not pause it" in refusal("pause", wid(wf), "--as-user", "dan")
    assert wf.reload().status == "ready"


BACKENDS = ["django.contrib.auth.backends.ModelBackend", "tests.testapp.permissions.PerRunBackend"]


@override_settings(AUTHENTICATION_BACKENDS=BACKENDS)
def test_as_user_asks_an_object_level_backend_with_each_run(django_user_model):
    staff_user(django_user_model, "erin", *VIEW)
    granted, other = ready(), ready()
    grant = ("erin", "pgbus_workflows.pause_workflowrun", granted.record.pk)
    GRANTS.add(grant)
    try:
        out, err = StringIO(), StringIO()
        with pytest.raises(CommandError, match=r"^1 of 2 runs refused$"):
            call_command("workflows", "pause", wid(granted), wid(other), "--as-user", "erin", stdout=out, stderr=err)
    finally:
        GRANTS.discard(grant)
    assert (granted.reload().status, other.reload().status) == ("paused", "ready")
    assert "erin may not pause it" in err.getvalue()


def test_as_user_must_exist_be_active_staff_and_not_come_with_an_actor(django_user_model):
    wf = ready()
    django_user_model.objects.create_user(username="frank", password="x")  # not staff
    staff_user(django_user_model, "gina", *VIEW, "pause_workflowrun")
    before = snapshot(wf)
    assert refusal("pause", wid(wf), "--as-user", "nobody") == "--as-user: there is no user 'nobody'"
    assert refusal("pause", wid(wf), "--as-user", "frank") == (
        "--as-user: frank may not use the admin (they must be active and staff)"
    )
    assert (
        refusal("list", "--as-user", "frank")
        == "--as-user: frank may not use the admin (they must be active and staff)"
    )
    assert refusal("pause", wid(wf), "--as-user", "gina", "--actor", "someone-else") == (
        "--actor and --as-user do not go together: the user's username is the actor"
    )
    assert snapshot(wf) == before


def test_as_user_lists_and_shows_only_with_the_view_permissions(django_user_model):
    staff_user(django_user_model, "hal")
    staff_user(django_user_model, "ivy", "view_workflowrun")
    staff_user(django_user_model, "jo", *VIEW, "pause_workflowrun", "cancel_workflowrun")
    wf = paused_on_error()
    assert refusal("list", "--as-user", "hal") == "hal may not view workflow runs"
    assert refusal("show", wid(wf), "--as-user", "hal") == "hal may not view workflow runs"

    page = json.loads(cli("show", wid(wf), "--json", "--as-user", "ivy")[0])
    assert (page["attempts"], page["events"], page["pending_signals"], page["allowed_verbs"]) == (None, None, None, [])
    assert "Attempts: not shown (no view permission)" in cli("show", wid(wf), "--as-user", "ivy")[0]
    assert [row["workflow_id"] for row in json.loads(cli("list", "--json", "--as-user", "ivy")[0])] == [wid(wf)]

    page = json.loads(cli("show", wid(wf), "--json", "--as-user", "jo")[0])
    assert page["allowed_verbs"] == ["resume", "cancel"]
    assert [a["step_name"] for a in page["attempts"]] == ["flaky"]


def test_as_user_show_gives_a_steps_error_text_only_with_the_permission_to_view_attempts(django_user_model):
    staff_user(django_user_model, "bob", "view_workflowrun", "view_workflowevent")
    staff_user(django_user_model, "carol", "view_workflowrun", "view_workflowevent", "view_workflowstep")
    wf = paused_on_error()
    error = "the first attempt fails"

    page = json.loads(cli("show", wid(wf), "--json", "--as-user", "bob")[0])
    failure = next(event for event in page["events"] if event["kind"] == "step_failed")
    assert page["run"]["paused_reason"] == failure["reason"] == WITHHELD
    assert failure["details"]["error_message"] == WITHHELD
    assert failure["details"]["error_class"] == "RuntimeError"  # what failed stays, not what it said
    out = cli("show", wid(wf), "--full", "--as-user", "bob")[0]
    assert error not in out
    assert f"paused because   {WITHHELD}" in out

    for who in (["--as-user", "carol"], []):  # without --as-user: the trusted shell
        page = json.loads(cli("show", wid(wf), "--json", *who)[0])
        failure = next(event for event in page["events"] if event["kind"] == "step_failed")
        assert page["run"]["paused_reason"] == failure["reason"] == f"RuntimeError: {error}"
        assert failure["details"]["error_message"] == error
        out = cli("show", wid(wf), "--full", *who)[0]
        assert f"paused because   RuntimeError: {error}" in out
        assert "Withheld" not in out
