"""The operator verbs on a run's handle (docs/operating.md, "From code: a run's handle").

Every verb takes ``actor=`` and ``reason=``, writes one event, and refuses a move its run's
state does not allow (``InvalidTransition``, ``NotPaused``, ``StepNotDefined``) without
changing anything.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from pgbus_workflows import InvalidTransition, NotPaused, StepNotDefined, Workflow, step
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps, claim_step
from pgbus_workflows.services.executor import execute_step
from tests.support import CLOCK_SLACK, record, snapshot, steps_of
from tests.testapp.models import Order, SideEffect

pytestmark = pytest.mark.django_db

QUEUE = "op_queue"


class Boom(Exception):
    """Raised on purpose by a step body."""


class OpThree(Workflow):
    name = "op_three"
    step_options = {"queue": QUEUE}

    @step
    def a(self):
        record("op_three.a")
        return {"a": 1}

    @step
    def b(self):
        record("op_three.b")

    @step
    def c(self):
        record("op_three.c")


class OpLater(Workflow):
    name = "op_later"
    step_options = {"queue": QUEUE}

    @step(wait=timedelta(hours=1))
    def later(self):
        record("op_later.later")

    @step
    def done(self):
        record("op_later.done")


class OpFlaky(Workflow):
    """Its first step fails on the first attempt (default policy: the run pauses)."""

    name = "op_flaky"
    step_options = {"queue": QUEUE}

    @step
    def boom(self):
        if self.attempt == 1:
            raise Boom("first attempt fails")
        record("op_flaky.boom")

    @step
    def after(self):
        record("op_flaky.after")


class OpSelfPause(Workflow):
    """Its first step pauses the run from inside the body on the first attempt."""

    name = "op_self_pause"
    step_options = {"queue": QUEUE}

    @step
    def check(self):
        if self.attempt == 1:
            self.pause("needs a look")
        record("op_self_pause.check")

    @step
    def after(self):
        record("op_self_pause.after")


# -- helpers ------------------------------------------------------------------------------------


def claim_one() -> WorkflowStep:
    """Claim the one due step (the run becomes performing)."""
    claimed = claim_due_steps(1, queues=[QUEUE])
    assert len(claimed) == 1, "expected a due step"
    return claimed[0]


def run_due_step() -> None:
    """Claim whichever step is due on the queue (not a given run's) and run it through the executor."""
    execute_step(claim_one())


def run_unknown_inline(handle) -> None:
    """Run a step that this code does not define as the test helpers do (a dispatcher passes it over)."""
    assert claim_due_steps(1, queues=[QUEUE]) == []
    scheduled = WorkflowStep.objects.get(run_id=handle.record.pk, status="scheduled")
    execute_step(claim_step(scheduled.pk))


def event_count(wf) -> int:
    return WorkflowEvent.objects.filter(run_id=wf.record.pk).count()


def events_after(wf, count: int) -> list[WorkflowEvent]:
    return list(WorkflowEvent.objects.filter(run_id=wf.record.pk).order_by("pk"))[count:]


def assert_transition_event(event, *, kind, transition, from_status, to_status, actor, reason):
    assert (event.kind, event.transition, event.from_status, event.to_status) == (
        kind,
        transition,
        from_status,
        to_status,
    )
    assert (event.actor, event.reason) == (actor, reason)


def finished_run(order) -> OpThree:
    wf = OpThree.start(order, color="red")
    for _ in range(3):
        run_due_step()
    assert wf.reload().status == "finished"
    return wf


def failed_run(order) -> OpFlaky:
    wf = OpFlaky.start(order)
    run_due_step()
    wf.reload()
    assert wf.status == "paused"
    assert [(s.step_name, s.status) for s in steps_of(wf)] == [("boom", "failed")]
    return wf


# -- pause --------------------------------------------------------------------------------------


def test_pause_ready_run_keeps_the_scheduled_row_and_its_time(order):
    wf = OpLater.start(order)
    (scheduled,) = steps_of(wf)
    before = event_count(wf)

    assert wf.pause(actor="alice", reason="fraud check") is wf

    assert wf.status == "paused"
    assert wf.record.paused_reason == "fraud check"
    assert WorkflowRun.objects.get(pk=wf.record.pk).status == "paused"
    (row,) = steps_of(wf)
    assert (row.pk, row.status, row.scheduled_at) == (scheduled.pk, "scheduled", scheduled.scheduled_at)
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="paused",
        transition="pause",
        from_status="ready",
        to_status="paused",
        actor="alice",
        reason="fraud check",
    )


def test_pause_without_actor_records_the_default_actor(order):
    wf = OpThree.start(order)
    before = event_count(wf)
    wf.pause()
    (event,) = events_after(wf, before)
    assert (event.kind, event.actor, event.reason) == ("paused", "api", "")


def test_pause_performing_run_lets_the_step_finish_and_holds(order):
    wf = OpThree.start(order)
    claimed = claim_one()
    before = event_count(wf)

    wf.pause(actor="alice", reason="hold on")

    assert wf.status == "paused"
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="paused",
        transition="pause",
        from_status="performing",
        to_status="paused",
        actor="alice",
        reason="hold on",
    )
    assert WorkflowStep.objects.get(pk=claimed.pk).status == "in_progress"

    execute_step(claimed)

    wf.reload()
    assert wf.status == "paused"
    assert [(s.step_name, s.status, s.output) for s in steps_of(wf)] == [
        ("a", "completed", {"a": 1}),
        ("b", "scheduled", None),
    ]
    hold = events_after(wf, before)[-1]
    assert (hold.kind, hold.transition, hold.from_status, hold.to_status) == (
        "step_completed",
        "hold",
        "paused",
        "paused",
    )
    assert claim_due_steps(10, queues=[QUEUE]) == []


@pytest.mark.parametrize("state", ["paused", "finished", "cancelled"])
def test_pause_refused_outside_ready_waiting_performing(order, state):
    wf = OpThree.start(order)
    if state == "paused":
        wf.pause()
    elif state == "cancelled":
        wf.cancel()
    else:
        for _ in range(3):
            run_due_step()
    before = snapshot(wf)

    with pytest.raises(InvalidTransition, match=f"Cannot pause a {state} workflow"):
        wf.pause(actor="alice", reason="again")

    assert snapshot(wf) == before


# -- resume -------------------------------------------------------------------------------------


def test_resume_keeps_a_future_step_at_its_time(order):
    wf = OpLater.start(order)
    (scheduled,) = steps_of(wf)
    assert scheduled.scheduled_at > timezone.now() + timedelta(minutes=50)
    wf.pause(actor="alice", reason="fraud check")
    before = event_count(wf)

    assert wf.resume(actor="bob", reason="cleared") is wf

    assert wf.status == "ready"
    assert wf.record.paused_reason == ""
    (row,) = steps_of(wf)
    assert (row.pk, row.status, row.scheduled_at) == (scheduled.pk, "scheduled", scheduled.scheduled_at)
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="resumed",
        transition="resume",
        from_status="paused",
        to_status="ready",
        actor="bob",
        reason="cleared",
    )
    assert event.step_id == scheduled.pk
    assert claim_due_steps(10, queues=[QUEUE]) == []


def test_resume_after_a_failed_step_schedules_a_fresh_attempt_now(order):
    wf = failed_run(order)
    failed = steps_of(wf)[0]
    assert failed.error_class.endswith("Boom")
    before = event_count(wf)

    wf.resume(actor="bob", reason="fixed the bug")

    assert wf.status == "ready"
    old, fresh = steps_of(wf)
    assert (old.pk, old.status) == (failed.pk, "failed")
    assert (fresh.step_name, fresh.attempt, fresh.status) == ("boom", 2, "scheduled")
    assert fresh.scheduled_at <= timezone.now() + CLOCK_SLACK
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="resumed",
        transition="resume",
        from_status="paused",
        to_status="ready",
        actor="bob",
        reason="fixed the bug",
    )
    assert event.step_id == fresh.pk

    run_due_step()
    run_due_step()
    assert wf.reload().status == "finished"
    assert list(SideEffect.objects.values_list("label", flat=True)) == ["op_flaky.boom", "op_flaky.after"]


def test_resume_after_a_body_pause_runs_the_step_again_now(order):
    wf = OpSelfPause.start(order)
    run_due_step()
    wf.reload()
    assert (wf.status, wf.record.paused_reason) == ("paused", "needs a look")
    assert [(s.status, s.outcome) for s in steps_of(wf)] == [("cancelled", "paused")]

    wf.resume(actor="bob")

    assert wf.status == "ready"
    fresh = steps_of(wf)[-1]
    assert (fresh.step_name, fresh.attempt, fresh.status) == ("check", 2, "scheduled")
    assert fresh.scheduled_at <= timezone.now() + CLOCK_SLACK
    run_due_step()
    run_due_step()
    assert wf.reload().status == "finished"


def test_resume_of_a_run_paused_while_performing_goes_back_to_performing(order):
    wf = OpThree.start(order)
    claimed = claim_one()
    wf.pause(actor="alice")
    before = event_count(wf)

    wf.resume(actor="bob", reason="go on")

    assert wf.status == "performing"
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="resumed",
        transition="resume",
        from_status="paused",
        to_status="performing",
        actor="bob",
        reason="go on",
    )
    execute_step(claimed)
    wf.reload()
    assert wf.status == "ready"
    assert [(s.step_name, s.status) for s in steps_of(wf)] == [("a", "completed"), ("b", "scheduled")]


@pytest.mark.parametrize("state", ["ready", "performing", "finished", "cancelled"])
def test_resume_refused_unless_paused(order, state):
    wf = OpThree.start(order)
    if state == "performing":
        claim_one()
    elif state == "cancelled":
        wf.cancel()
    elif state == "finished":
        for _ in range(3):
            run_due_step()
    before = snapshot(wf)

    with pytest.raises(NotPaused, match=f"Cannot resume a {state} workflow: it is not paused"):
        wf.resume(actor="bob", reason="go")

    assert snapshot(wf) == before


# -- resume_at ----------------------------------------------------------------------------------


def test_resume_at_cancels_the_active_attempt_and_schedules_that_step_now(order):
    wf = OpLater.start(order)
    (scheduled,) = steps_of(wf)
    wf.pause(actor="alice")
    before = event_count(wf)

    assert wf.resume_at("done", actor="bob", reason="skip the wait") is wf

    assert wf.status == "ready"
    assert wf.current_step == "done"
    old, new = steps_of(wf)
    assert (old.pk, old.status, old.outcome) == (scheduled.pk, "cancelled", "cancelled")
    assert (new.step_name, new.status, new.attempt) == ("done", "scheduled", 1)
    assert new.scheduled_at <= timezone.now() + CLOCK_SLACK
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="resumed_at",
        transition="resume",
        from_status="paused",
        to_status="ready",
        actor="bob",
        reason="skip the wait",
    )
    assert event.details == {"step": "done"}
    assert event.step_id == new.pk

    run_due_step()
    assert wf.reload().status == "finished"
    assert list(SideEffect.objects.values_list("label", flat=True)) == ["op_later.done"]


def test_resume_at_an_earlier_step_after_a_failure(order):
    wf = OpThree.start(order)
    run_due_step()  # a
    claimed = claim_one()  # b
    wf.pause()
    execute_step(claimed)  # b completes, c scheduled, the run holds
    wf.reload()
    assert [(s.step_name, s.status) for s in steps_of(wf)] == [
        ("a", "completed"),
        ("b", "completed"),
        ("c", "scheduled"),
    ]

    wf.resume_at("a", actor="bob", reason="redo")

    assert [(s.step_name, s.status, s.attempt) for s in steps_of(wf)] == [
        ("a", "completed", 1),
        ("b", "completed", 1),
        ("c", "cancelled", 1),
        ("a", "scheduled", 2),
    ]
    assert (wf.status, wf.current_step) == ("ready", "a")


def test_resume_at_an_unknown_step_lists_the_available_steps(order):
    wf = OpThree.start(order)
    wf.pause()
    before = snapshot(wf)

    with pytest.raises(StepNotDefined) as raised:
        wf.resume_at("nope", actor="bob", reason="typo")

    assert str(raised.value) == "Step 'nope' is not defined in op_three. Available steps: a, b, c"
    assert snapshot(wf) == before


def test_resume_at_refused_unless_paused(order):
    wf = OpThree.start(order)
    before = snapshot(wf)
    with pytest.raises(NotPaused, match="Cannot resume_at a ready workflow: it is not paused"):
        wf.resume_at("b", actor="bob")
    assert snapshot(wf) == before


# -- cancel -------------------------------------------------------------------------------------


def test_cancel_ready_run_cancels_its_scheduled_step(order):
    wf = OpLater.start(order)
    (scheduled,) = steps_of(wf)
    before = event_count(wf)

    assert wf.cancel(actor="bob", reason="customer asked") is wf

    assert wf.status == "cancelled"
    assert wf.record.finished_at is not None
    (row,) = steps_of(wf)
    assert (row.pk, row.status, row.outcome) == (scheduled.pk, "cancelled", "cancelled")
    assert row.finished_at is not None
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="cancelled",
        transition="cancel",
        from_status="ready",
        to_status="cancelled",
        actor="bob",
        reason="customer asked",
    )
    assert event.step_id == scheduled.pk


def test_cancel_paused_run_with_a_failed_step(order):
    wf = failed_run(order)
    before = event_count(wf)

    wf.cancel(actor="bob", reason="give up")

    assert wf.status == "cancelled"
    assert [(s.status, s.outcome) for s in steps_of(wf)] == [("failed", "failed")]
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="cancelled",
        transition="cancel",
        from_status="paused",
        to_status="cancelled",
        actor="bob",
        reason="give up",
    )
    assert event.step_id is None


def test_cancel_of_a_claimed_step_before_its_body_starts_means_the_body_never_runs(order):
    wf = OpThree.start(order)
    claimed = claim_one()
    before = event_count(wf)

    wf.cancel(actor="bob", reason="stop")

    assert wf.status == "cancelled"
    assert WorkflowStep.objects.get(pk=claimed.pk).status == "cancelled"
    (event,) = events_after(wf, before)
    assert (event.kind, event.from_status, event.actor, event.reason) == ("cancelled", "performing", "bob", "stop")

    assert execute_step(claimed) is None

    wf.reload()
    assert wf.status == "cancelled"
    (row,) = steps_of(wf)
    assert (row.status, row.outcome, row.output) == ("cancelled", "cancelled", None)
    # A body already running when the cancel lands is discarded instead (tests/services/test_races.py).
    assert [e.kind for e in events_after(wf, before)] == ["cancelled"]


@pytest.mark.parametrize("state", ["finished", "cancelled"])
def test_cancel_refused_on_a_finished_or_cancelled_run(order, state):
    wf = OpThree.start(order)
    if state == "cancelled":
        wf.cancel()
    else:
        for _ in range(3):
            run_due_step()
    before = snapshot(wf)

    with pytest.raises(InvalidTransition, match=f"Cannot cancel a {state} workflow"):
        wf.cancel(actor="bob", reason="again")

    assert snapshot(wf) == before


# -- rerun --------------------------------------------------------------------------------------


def test_rerun_of_a_finished_run_starts_a_new_run(order):
    old = finished_run(order)
    before = event_count(old)

    new = old.rerun(actor="carol", reason="again please")

    assert isinstance(new, OpThree)
    assert new.workflow_id != old.workflow_id
    assert new.status == "ready"
    assert new.record.rerun_of == old.workflow_id
    assert (new.record.subject_type, new.record.subject_id) == (old.record.subject_type, old.record.subject_id)
    assert new.subject == order
    assert new.arguments == {"color": "red"} == old.reload().arguments
    assert [(s.step_name, s.status) for s in steps_of(new)] == [("a", "scheduled")]
    started = new.events.get()
    assert (started.kind, started.actor) == ("started", "carol")
    assert started.details["rerun_of"] == str(old.workflow_id)

    assert old.status == "finished"
    (event,) = events_after(old, before)
    assert (event.kind, event.actor, event.reason) == ("rerun", "carol", "again please")
    assert event.details == {"new_workflow_id": str(new.workflow_id)}


def test_rerun_of_a_cancelled_run(order):
    old = OpThree.start(order, color="blue")
    old.cancel(actor="bob")

    new = old.rerun(actor="carol")

    assert new.record.rerun_of == old.workflow_id
    assert new.arguments == {"color": "blue"}
    assert WorkflowRun.objects.filter(workflow_class="op_three").count() == 2


@pytest.mark.parametrize(("state", "hint"), [("paused", "resume it"), ("ready", "cancel it first")])
def test_rerun_refused_on_an_ongoing_run(order, state, hint):
    wf = OpThree.start(order)
    if state == "paused":
        wf.pause()
    before = snapshot(wf)

    with pytest.raises(InvalidTransition, match=f"Cannot rerun a {state} workflow.*{hint}"):
        wf.rerun(actor="carol", reason="again")

    assert snapshot(wf) == before


# -- run_now ------------------------------------------------------------------------------------


def test_run_now_pulls_a_wait_forward(order):
    wf = OpLater.start(order)
    (scheduled,) = steps_of(wf)
    before = event_count(wf)

    assert wf.run_now(actor="dave", reason="customer is waiting") is wf

    assert wf.status == "ready"
    (row,) = steps_of(wf)
    assert (row.pk, row.status) == (scheduled.pk, "scheduled")
    assert row.scheduled_at <= timezone.now() + CLOCK_SLACK < scheduled.scheduled_at
    (event,) = events_after(wf, before)
    assert (event.kind, event.actor, event.reason, event.step_id) == (
        "run_now",
        "dave",
        "customer is waiting",
        scheduled.pk,
    )
    assert event.details == {"was_scheduled_at": scheduled.scheduled_at.isoformat()}

    run_due_step()
    assert list(SideEffect.objects.values_list("label", flat=True)) == ["op_later.later"]


def test_run_now_refused_when_the_step_is_already_due(order):
    wf = OpThree.start(order)
    before = snapshot(wf)
    with pytest.raises(InvalidTransition, match="Cannot run_now: step a is already due"):
        wf.run_now(actor="dave", reason="hurry")
    assert snapshot(wf) == before


@pytest.mark.parametrize("state", ["performing", "finished", "cancelled"])
def test_run_now_refused_without_a_scheduled_step(order, state):
    wf = OpLater.start(order)
    if state == "cancelled":
        wf.cancel()
    else:
        wf.run_now()
        claimed = claim_one()
        if state == "finished":
            execute_step(claimed)
            run_due_step()
    before = snapshot(wf)

    with pytest.raises(InvalidTransition, match=f"Cannot run_now a {state} workflow"):
        wf.run_now(actor="dave")

    assert snapshot(wf) == before


# -- skip ---------------------------------------------------------------------------------------


def test_skip_on_a_ready_run_skips_the_step_and_schedules_the_next(order):
    wf = OpLater.start(order)
    (scheduled,) = steps_of(wf)
    before = event_count(wf)

    assert wf.skip(actor="erin", reason="not needed") is wf

    assert (wf.status, wf.current_step) == ("ready", "done")
    skipped, following = steps_of(wf)
    assert (skipped.pk, skipped.status, skipped.outcome) == (scheduled.pk, "skipped", "skipped")
    assert (following.step_name, following.status) == ("done", "scheduled")
    assert following.scheduled_at <= timezone.now() + CLOCK_SLACK
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="step_skipped",
        transition="advance",
        from_status="ready",
        to_status="ready",
        actor="erin",
        reason="not needed",
    )
    assert event.details == {"next_step": "done", "skipped": "later"}

    run_due_step()
    assert wf.reload().status == "finished"
    assert list(SideEffect.objects.values_list("label", flat=True)) == ["op_later.done"]


def test_skip_at_the_last_step_finishes_the_run(order):
    wf = OpThree.start(order)
    run_due_step()
    run_due_step()
    before = event_count(wf)

    wf.skip(actor="erin", reason="enough")

    assert wf.status == "finished"
    assert wf.record.finished_at is not None
    assert [(s.step_name, s.status) for s in steps_of(wf)] == [
        ("a", "completed"),
        ("b", "completed"),
        ("c", "skipped"),
    ]
    (event,) = events_after(wf, before)
    assert_transition_event(
        event,
        kind="finished",
        transition="finish",
        from_status="ready",
        to_status="finished",
        actor="erin",
        reason="enough",
    )
    assert event.details["skipped"] == "c"
    assert event.details["last_step_outcome"] == "skipped"


def test_skip_on_a_paused_run_moves_past_the_failed_step(order):
    wf = failed_run(order)
    failed = steps_of(wf)[0]
    before = event_count(wf)

    wf.skip(actor="erin", reason="boom is optional")

    assert (wf.status, wf.current_step) == ("ready", "after")
    old, following = steps_of(wf)
    assert (old.pk, old.status, old.outcome) == (failed.pk, "failed", "failed")
    assert (following.step_name, following.status) == ("after", "scheduled")
    resumed, skipped = events_after(wf, before)
    assert_transition_event(
        resumed,
        kind="resumed",
        transition="resume",
        from_status="paused",
        to_status="ready",
        actor="erin",
        reason="boom is optional",
    )
    assert_transition_event(
        skipped,
        kind="step_skipped",
        transition="advance",
        from_status="ready",
        to_status="ready",
        actor="erin",
        reason="boom is optional",
    )
    assert skipped.details == {"next_step": "after", "skipped": "boom"}

    run_due_step()
    assert wf.reload().status == "finished"
    assert list(SideEffect.objects.values_list("label", flat=True)) == ["op_flaky.after"]


def test_skip_on_a_paused_run_with_a_scheduled_step(order):
    wf = OpLater.start(order)
    wf.pause(actor="alice")

    wf.skip(actor="erin")

    assert (wf.status, wf.current_step) == ("ready", "done")
    assert [(s.step_name, s.status) for s in steps_of(wf)] == [("later", "skipped"), ("done", "scheduled")]


@pytest.mark.parametrize("state", ["performing", "finished", "cancelled"])
def test_skip_refused_unless_ready_or_paused(order, state):
    wf = OpThree.start(order)
    if state == "performing":
        claim_one()
    elif state == "cancelled":
        wf.cancel()
    else:
        for _ in range(3):
            run_due_step()
    before = snapshot(wf)

    with pytest.raises(InvalidTransition, match=f"Cannot skip on a {state} workflow") as raised:
        wf.skip(actor="erin", reason="skip it")

    if state == "performing":
        assert "its step is running" in str(raised.value)
    assert snapshot(wf) == before


# -- a run whose class is gone ------------------------------------------------------------------


def orphan(order) -> Workflow:
    """A run of OpThree whose class name is no longer registered, found as a bare Workflow."""
    wf = OpThree.start(order)
    WorkflowRun.objects.filter(pk=wf.record.pk).update(workflow_class="op_gone_forever")
    handle = Workflow.find(wf.workflow_id)
    assert type(handle) is Workflow
    return handle


def test_a_run_of_an_unregistered_class_can_be_cancelled(order):
    handle = orphan(order)
    before = event_count(handle)

    handle.cancel(actor="ops", reason="class deleted")

    assert handle.status == "cancelled"
    assert [(s.status, s.outcome) for s in steps_of(handle)] == [("cancelled", "cancelled")]
    (event,) = events_after(handle, before)
    assert (event.kind, event.transition, event.actor, event.reason) == ("cancelled", "cancel", "ops", "class deleted")


def test_a_run_of_an_unregistered_class_pauses_and_refuses_resume_and_rerun(order):
    handle = orphan(order)
    run_unknown_inline(handle)
    handle.reload()
    assert handle.status == "paused"
    (failed,) = steps_of(handle)
    assert (failed.status, failed.error_class) == ("failed", "pgbus_workflows.exceptions.StepNotDefined")

    before = snapshot(handle)
    with pytest.raises(StepNotDefined, match="its step 'a' is not defined in op_gone_forever"):
        handle.resume(actor="ops")
    with pytest.raises(StepNotDefined, match="Available steps: none"):
        handle.resume_at("a", actor="ops")
    assert snapshot(handle) == before

    handle.cancel(actor="ops")
    before = snapshot(handle)
    with pytest.raises(InvalidTransition, match="'op_gone_forever' is not registered"):
        handle.rerun(actor="ops")
    assert snapshot(handle) == before


def test_rerun_refused_when_the_subject_is_gone(order):
    wf = finished_run(order)
    Order.objects.filter(pk=order.pk).delete()
    before = snapshot(wf)
    with pytest.raises(InvalidTransition, match="no longer exists"):
        wf.rerun(actor="carol")
    assert snapshot(wf) == before


def test_skip_refuses_a_run_whose_current_step_is_not_defined(order):
    """A renamed step pauses the run with StepNotDefined; there is no "next step" to skip to.

    Like resume(), skip() must refuse (and say resume_at() or cancel), not finish the run with
    its remaining steps never run.
    """
    wf = OpThree.start(order)
    WorkflowStep.objects.filter(run_id=wf.record.pk).update(step_name="renamed_away")
    WorkflowRun.objects.filter(pk=wf.record.pk).update(current_step="renamed_away")
    run_unknown_inline(wf)
    wf.reload()
    assert wf.status == "paused"
    assert [(s.step_name, s.status, s.error_class) for s in steps_of(wf)] == [
        ("renamed_away", "failed", "pgbus_workflows.exceptions.StepNotDefined")
    ]
    before = snapshot(wf)

    with pytest.raises(StepNotDefined, match="renamed_away"):
        wf.skip(actor="erin", reason="move on")

    assert snapshot(wf) == before
