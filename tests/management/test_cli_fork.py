"""``manage.py workflows fork RUN_ID... [--from-step STEP]`` (docs/operating.md, "Fork a run")."""

import json

import pytest

from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.testing import WorkflowTestMixin
from tests.management.test_cli import cli, refusal, wid
from tests.support import events_of, labels, snapshot
from tests.testapp.models import Order
from tests.testapp.workflows import ThreeSteps

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()


def finished():
    wf = helpers.speedrun_workflow(ThreeSteps.start(Order.objects.create()))
    assert wf.status == "finished"
    return wf


def test_fork_from_a_step_reports_the_new_run_and_records_who_and_why():
    wf = finished()

    out, _err = cli("fork", wid(wf), "--from-step", "two", "--actor", "alice", "--reason", "fixed in 1.2")

    fork = WorkflowRun.objects.get(forked_from=wf.workflow_id)
    assert out.strip() == f"{wid(wf)}  fork as {fork.workflow_id} from step two (ready)"
    assert (fork.workflow_class, fork.current_step, fork.status) == ("three_steps", "two", "ready")
    assert [(e.actor, e.reason) for e in events_of(wf, "forked")] == [("alice", "fixed in 1.2")]
    labels_before = labels()
    forked = helpers.speedrun_workflow(ThreeSteps.find(fork.workflow_id))
    assert labels()[len(labels_before) :] == ["two", "three"]
    assert forked.outputs["two"] == {"n": 2}  # read "one"'s copied output


def test_fork_without_a_step_starts_at_the_first_and_json_names_the_new_run():
    wf = finished()

    (result,) = json.loads(cli("fork", wid(wf), "--json")[0])

    fork = WorkflowRun.objects.get(forked_from=wf.workflow_id)
    assert (result["verb"], result["ok"], result["new_run"], result["new_status"]) == (
        "fork",
        True,
        str(fork.workflow_id),
        "ready",
    )
    assert fork.current_step == "one"


def test_fork_is_refused_with_the_services_message_and_changes_nothing():
    wf = finished()
    before = snapshot(wf)

    assert refusal("fork", wid(wf), "--from-step", "nope") == (
        f"{wid(wf)}: Step 'nope' is not defined in three_steps. Available steps: one, two, three"
    )
    assert snapshot(wf) == before


def test_fork_of_an_ongoing_run_of_a_one_per_subject_class_says_to_cancel_it_first():
    wf = ThreeSteps.start(Order.objects.create())
    wf.pause(reason="looking")

    message = refusal("fork", wid(wf))

    assert "allows one ongoing run per subject and the original is paused; cancel it first" in message
