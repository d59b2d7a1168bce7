"""Forking a run (services/forking.py; docs/operating.md, "Fork a run").

A fork is a new run of the original's class, subject and arguments that starts at
``from_step``; the steps before it are copies of the original's successful attempts, read
through ``self.outputs`` as the fork's own, and are not run again.
"""

import re

import pytest
from django.test import TestCase

from pgbus_workflows import AlreadyRunning, InvalidTransition, Job, StepNotDefined, Workflow, fan_out, step
from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.models import FanOutJob, WorkflowRun, WorkflowStep
from pgbus_workflows.services.forking import COPIED_FROM
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import events_of, labels, record, run_next, snapshot, steps_of
from tests.testapp.jobs import square
from tests.testapp.models import Order
from tests.testapp.workflows import Approval

pytestmark = pytest.mark.django_db

#: Step ``c`` of ForkFour fails while this holds (a bug, until the test "deploys the fix").
BUG = {"in_c": True}


class Boom(Exception):
    """The bug in step c."""


class ForkFour(Workflow):
    """Four steps; c reads a's and b's outputs the way a body reads an earlier step's."""

    name = "fork_four"

    @step
    def a(self):
        record("a")
        return {"a": self.arguments["n"]}

    @step
    def b(self):
        record("b")
        return {"b": self.outputs["a"]["a"] * 10}

    @step
    def c(self):
        record("c")
        if BUG["in_c"]:
            raise Boom("bug in c")
        return {"c": self.outputs["a"]["a"] + self.outputs["b"]["b"]}

    @step
    def d(self):
        record("d")
        return {"d": self.outputs["c"]["c"]}


class ForkMany(ForkFour):
    name = "fork_many"
    allow_multiple = True


@pytest.fixture(autouse=True)
def _bug():
    BUG["in_c"] = True
    yield
    BUG["in_c"] = True


def run_to_end(wf):
    while wf.reload().status in ("ready", "performing"):
        run_next(wf)
    return wf


def failed_in_c(cls=ForkFour, subject=None):
    """A run of ``cls`` paused by the bug in c (a and b completed)."""
    wf = cls.start(subject or Order.objects.create(), n=2)
    run_to_end(wf)
    assert (wf.status, wf.current_step) == ("paused", "c")
    return wf


def test_a_fork_from_a_middle_step_keeps_the_earlier_outputs_and_runs_from_there():
    original = failed_in_c(ForkMany)
    BUG["in_c"] = False  # the fix is deployed
    labels_before = labels()

    fork = original.fork("c", actor="ops", reason="bug fixed")
    assert isinstance(fork, ForkMany)
    assert fork.workflow_id != original.workflow_id
    assert (fork.status, fork.current_step) == ("ready", "c")
    assert fork.record.forked_from == original.workflow_id
    assert (fork.subject, fork.arguments) == (original.subject, original.arguments)
    run_to_end(fork)

    assert fork.status == "finished"
    assert labels()[len(labels_before) :] == ["c", "d"]  # a and b did not run again
    assert fork.outputs == {"a": {"a": 2}, "b": {"b": 20}, "c": {"c": 22}, "d": {"d": 22}}
    copied = [s for s in steps_of(fork) if s.claimed_by.startswith(COPIED_FROM)]
    assert [(s.step_name, s.status, s.outcome, s.claimed_by) for s in copied] == [
        (name, "completed", "success", f"{COPIED_FROM}{original.workflow_id}") for name in ("a", "b")
    ]
    original_steps = {s.step_name: s.pk for s in steps_of(original) if s.outcome == "success"}
    assert [(e.step_id, e.details) for e in events_of(fork, "step_copied")] == [
        (s.pk, {"forked_from": str(original.workflow_id), "original_step_id": original_steps[s.step_name]})
        for s in copied
    ]
    assert original.reload().status == "paused"  # the original is left as it was


def test_both_runs_get_an_audit_event_naming_the_other():
    original = failed_in_c(ForkMany)

    fork = original.fork("c", actor="ops", reason="bug fixed")

    (forked,) = events_of(original, "forked")
    assert (forked.actor, forked.reason) == ("ops", "bug fixed")
    assert forked.details == {"fork_workflow_id": str(fork.workflow_id), "from_step": "c", "copied_steps": ["a", "b"]}
    started, copied_a, copied_b, forked_from = events_of(fork)[:4]
    assert (started.kind, started.actor, started.to_status) == ("started", "ops", "ready")
    assert started.details["forked_from"] == str(original.workflow_id)
    assert [(e.kind, e.actor) for e in (copied_a, copied_b)] == [("step_copied", "ops")] * 2
    assert (forked_from.kind, forked_from.actor, forked_from.reason) == ("forked_from", "ops", "bug fixed")
    assert forked_from.details == {
        "forked_from": str(original.workflow_id),
        "from_step": "c",
        "copied_steps": ["a", "b"],
    }


def test_a_fork_from_the_first_step_copies_nothing():
    original = failed_in_c(ForkMany)

    fork = original.fork(actor="ops")

    assert fork.current_step == "a"
    assert [(s.step_name, s.status) for s in steps_of(fork)] == [("a", "scheduled")]
    assert events_of(fork, "forked_from")[0].details["copied_steps"] == []


def test_a_fork_from_the_last_step_runs_only_it():
    original = ForkMany.start(Order.objects.create(), n=3)
    BUG["in_c"] = False
    run_to_end(original)
    assert original.status == "finished"
    labels_before = labels()

    fork = run_to_end(original.fork("d"))

    assert labels()[len(labels_before) :] == ["d"]
    assert fork.outputs == {**original.outputs, "d": {"d": 33}}


def test_a_fork_of_a_fork_copies_from_the_fork():
    original = failed_in_c(ForkMany)
    BUG["in_c"] = False
    fork = run_to_end(original.fork("c"))

    second = run_to_end(fork.fork("d", reason="again"))

    assert second.record.forked_from == fork.workflow_id
    assert second.outputs == fork.outputs
    copied = [s.claimed_by for s in steps_of(second) if s.claimed_by.startswith(COPIED_FROM)]
    assert copied == [f"{COPIED_FROM}{fork.workflow_id}"] * 3


def test_a_finished_original_does_not_hold_the_subject_of_a_one_per_subject_class():
    original = ForkFour.start(Order.objects.create(), n=1)
    BUG["in_c"] = False
    run_to_end(original)

    fork = original.fork("c")

    assert fork.status == "ready" and fork.record.forked_from == original.workflow_id


def test_an_ongoing_run_of_a_one_per_subject_class_is_refused_clearly():
    original = failed_in_c(ForkFour)
    before = snapshot(original)

    with pytest.raises(AlreadyRunning, match="allows one ongoing run per subject and the original is paused"):
        original.fork("c")

    assert snapshot(original) == before
    assert WorkflowRun.objects.filter(workflow_class="fork_four").count() == 1


def test_another_ongoing_run_of_the_subject_is_named():
    order = Order.objects.create()
    original = ForkFour.start(order, n=1)
    BUG["in_c"] = False
    run_to_end(original)
    other = ForkFour.start(order, n=5)

    with pytest.raises(AlreadyRunning, match=f"run {other.workflow_id} is ready"):
        original.fork("c")


def test_an_unknown_step_is_refused_with_the_class_steps():
    original = failed_in_c(ForkMany)
    before = snapshot(original)

    with pytest.raises(
        StepNotDefined, match=re.escape("Step 'nope' is not defined in fork_many. Available steps: a, b, c, d")
    ):
        original.fork("nope")

    assert snapshot(original) == before


def test_a_run_whose_class_is_gone_is_refused(monkeypatch):
    original = failed_in_c(ForkMany)
    WorkflowRun.objects.filter(pk=original.record.pk).update(workflow_class="gone_class")

    with pytest.raises(InvalidTransition, match="workflow class 'gone_class' is not registered"):
        original.fork("c")

    assert registry.get("gone_class") is None


class ForkFan(Workflow):
    """A fan-out whose job results a later step sums."""

    name = "fork_fan"
    allow_multiple = True

    @fan_out
    def compute(self):
        record("compute")
        return [Job(square, n) for n in range(3)]

    @step
    def total(self):
        record("total")
        return {"sum": sum(self.fan_out_results("compute"))}


class ForkFanOutTests(WorkflowTestMixin, TestCase):
    def finished_fan(self):
        wf = self.perform_next_step(ForkFan.start(None))
        return self.speedrun_workflow(self.complete_fan_out(wf))

    def test_a_fan_out_before_from_step_is_copied_with_its_results(self):
        original = self.finished_fan()
        assert original.outputs["total"] == {"sum": 5}
        labels_before = labels()

        fork = self.speedrun_workflow(original.fork("total"))

        self.assertWorkflowStatus(fork, "finished")
        assert labels()[len(labels_before) :] == ["total"]
        assert fork.outputs["total"] == {"sum": 5}
        (compute,) = WorkflowStep.objects.filter(run_id=fork.record.pk, step_name="compute")
        assert compute.fan_out_total == 3
        assert list(
            FanOutJob.objects.filter(step_id=compute.pk).order_by("index").values_list("result", flat=True)
        ) == [
            0,
            1,
            4,
        ]

    def test_a_fork_from_the_fan_out_starts_it_afresh(self):
        original = self.finished_fan()

        fork = original.fork("compute")

        assert [(s.step_name, s.status) for s in steps_of(fork)] == [("compute", "scheduled")]
        self.speedrun_workflow(self.complete_fan_out(self.perform_next_step(fork)))
        self.assertWorkflowStatus(fork, "finished")
        assert FanOutJob.objects.filter(run_id=fork.record.pk).count() == 3


class ForkSignalTests(WorkflowTestMixin, TestCase):
    """A wait_for step before from_step is copied without its signal; from it, the fork waits for a new one."""

    def finished_approval(self):
        wf = self.perform_next_step(Approval.start(Order.objects.create()))
        self.deliver_signal(wf, "approved", {"amount": 5})
        self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")
        return wf

    def test_a_copied_wait_step_keeps_its_output_and_its_signal_is_not_delivered_again(self):
        original = self.finished_approval()

        fork = original.fork("done")

        (copied,) = WorkflowStep.objects.filter(run_id=fork.record.pk, step_name="approve")
        assert (copied.status, copied.output, copied.signal_id) == ("completed", {"amount": 5}, None)
        assert not fork.signals.exists()
        self.speedrun_workflow(fork)
        self.assertWorkflowStatus(fork, "finished")
        assert fork.outputs["approve"] == {"amount": 5}

    def test_a_fork_from_the_wait_step_waits_for_a_new_signal(self):
        original = self.finished_approval()

        fork = self.perform_next_step(original.fork("approve"))

        self.assertWorkflowStatus(fork, "waiting")
        self.deliver_signal(fork, "approved", {"amount": 6})
        self.speedrun_workflow(fork)
        assert fork.outputs["approve"] == {"amount": 6}


def test_a_run_whose_subject_was_deleted_is_refused():
    original = failed_in_c(ForkMany)
    Order.objects.filter(pk=original.record.subject_id).delete()

    with pytest.raises(InvalidTransition, match=r"its subject .* no longer exists"):
        original.fork("c")

    assert not WorkflowRun.objects.filter(forked_from=original.workflow_id).exists()
