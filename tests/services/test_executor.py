"""The executor: claiming due steps, the guards, the step body, its verbs and its outputs.

Steps are run with the public executor functions (``claim_due_steps``, ``claim_step``,
``execute_step``, ``run_due_steps``); everything is asserted on the rows.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from pgbus_workflows import NotInStep, OnException, Workflow, removed_step, step
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps, claim_step
from pgbus_workflows.services.executor import execute_step, run_due_steps
from tests.support import labels, record, run_next, scheduled, steps_of
from tests.testapp.models import Order, SideEffect

pytestmark = pytest.mark.django_db


class ExecBoomError(Exception):
    """Raised by the bodies of this file on purpose."""


class ExecGuardError(Exception):
    """Raised by cancel_if / skip_if on purpose."""


# -- workflows -------------------------------------------------------------------------------


class ExecThree(Workflow):
    name = "exec_three"

    @step
    def one(self):
        return {"n": 1}

    @step
    def two(self):
        return {"n": self.outputs["one"]["n"] + 1, "seen": sorted(self.outputs)}

    @step
    def three(self):
        record(f"three saw n={self.outputs['two']['n']}")


class ExecWait(Workflow):
    name = "exec_wait"

    @step
    def first(self):
        record("first")

    @step(wait=timedelta(hours=2))
    def later(self):
        record("later")


def _minutes_per_attempt(attempt):
    return timedelta(minutes=5 * attempt)


class ExecCallableWait(Workflow):
    name = "exec_callable_wait"

    @step
    def prepare(self):
        record(f"prepare {self.attempt}")

    @step(wait=_minutes_per_attempt)
    def remind(self):
        if self.attempt == 1:
            self.pause("go round again")
        record(f"remind {self.attempt}")


class ExecPrioLow(Workflow):
    name = "exec_prio_low"
    allow_multiple = True
    step_options = {"priority": 10}

    @step
    def go(self):
        record("low")


class ExecPrioHigh(Workflow):
    name = "exec_prio_high"
    step_options = {"priority": 10}

    @step(priority=-1)
    def go(self):
        record("high")


class ExecMailQueue(Workflow):
    name = "exec_mail_queue"
    step_options = {"queue": "exec_mail"}

    @step
    def send(self):
        record("mail")


class ExecDefaultQueue(Workflow):
    name = "exec_default_queue"

    @step
    def work(self):
        record("default")


class ExecTimeouts(Workflow):
    name = "exec_timeouts"

    @step
    def plain(self):
        pass

    @step(timeout=timedelta(minutes=5))
    def bounded(self):
        pass


class ExecSubject(Workflow):
    name = "exec_subject"

    @step
    def touch(self):
        record("touched")


class ExecSubjectOptional(Workflow):
    name = "exec_subject_optional"
    allow_missing_subject = True

    @step
    def touch(self):
        record(f"touched subject={self.subject}")


class ExecCancelIf(Workflow):
    name = "exec_cancel_if"

    def cancel_if(self):
        # reads the subject: only safe because the missing-subject guard runs first
        return self.subject.status == "void"

    @step(skip_if=True)
    def first(self):
        record("first")

    @step
    def second(self):
        record("second")


class ExecSkipIf(Workflow):
    name = "exec_skip_if"
    allow_multiple = True

    def already_done(self):
        return self.arguments.get("done", False)

    @step(skip_if=lambda wf: wf.subject.reviewed)
    def by_callable(self):
        record("by_callable")

    @step(skip_if="already_done")
    def by_method_name(self):
        record("by_method_name")

    @step(skip_if=True)
    def by_bool(self):
        record("by_bool")

    @step(skip_if=False)
    def never_skipped(self):
        record("never_skipped")


class ExecCancelIfBoom(Workflow):
    name = "exec_cancel_if_boom"
    exception_policies = [OnException(ExecGuardError, action="reattempt", max_reattempts=2)]

    def cancel_if(self):
        raise ExecGuardError("cancel_if broke")

    @step
    def guarded(self):
        record("guarded body")


def _exploding_condition(wf):
    raise ExecGuardError("skip_if broke")


class ExecSkipIfBoom(Workflow):
    name = "exec_skip_if_boom"

    @step(skip_if=_exploding_condition)
    def guarded(self):
        record("guarded body")


class ExecKnown(Workflow):
    name = "exec_known"
    # a blanket policy must not apply: an undefined step always pauses
    exception_policies = [OnException(action="skip")]

    @step
    def real(self):
        record("real")


class ExecGravestone(Workflow):
    name = "exec_gravestone"
    allow_multiple = True

    @step
    def first(self):
        record("first")

    old_reminder = removed_step()

    @step
    def last(self):
        record("last")


class ExecVerbs(Workflow):
    name = "exec_verbs"

    @step
    def act(self):
        verb = self.arguments["verb"]
        record(f"before {verb} attempt {self.attempt}")
        if verb == "reattempt" and self.attempt == 1:
            self.reattempt(wait=timedelta(minutes=3))
        if verb == "finished":
            self.finished()
        if verb == "skip":
            self.skip()
        if verb == "pause" and self.attempt == 1:
            self.pause("needs a human")
        if verb == "cancel":
            self.cancel("not wanted")
        if verb == "output":
            self.output({"early": True})
        record(f"after {verb}")
        return {"late": True}

    @step
    def follow(self):
        record(f"follow saw {self.outputs.get('act')}")


class ExecVoluntary(Workflow):
    name = "exec_voluntary"

    @step(on_exception="reattempt", max_reattempts=1)
    def poll(self):
        if self.attempt <= 3:
            self.reattempt()
        if self.attempt <= 5:
            raise ExecBoomError(f"attempt {self.attempt}")
        return "done"


class ExecKey(Workflow):
    name = "exec_key"

    @step
    def charge(self):
        record(f"charge {self.attempt}", self.step_idempotency_key)
        if self.attempt == 1:
            self.reattempt()

    @step
    def ship(self):
        record("ship", self.step_idempotency_key)


class ExecTooLarge(Workflow):
    name = "exec_too_large"

    @step
    def big(self):
        if self.arguments.get("via_output"):
            self.output("x" * 5000)
        return "x" * 5000


class ExecNotJson(Workflow):
    name = "exec_not_json"

    @step(on_exception="skip")
    def odd(self):
        return {"when": object()}

    @step
    def after(self):
        record("after odd")


def _explode(message):
    raise ExecBoomError(message)


class ExecErrors(Workflow):
    name = "exec_errors"

    @step
    def fail(self):
        if self.arguments.get("builtin"):
            raise ValueError("bad value 7")
        _explode("boom 42")


class ExecSwallow(Workflow):
    name = "exec_swallow"

    @step
    def act(self):
        try:
            if self.arguments["verb"] == "skip":
                self.skip()
            elif self.arguments["verb"] == "finished":
                self.finished()
            else:
                self.output({"via": "output"})
        except Exception:
            record("swallowed")
            return {"swallowed": True}
        record("after verb")
        return {"fell through": True}

    @step
    def follow(self):
        record("follow")


class ExecBadReattemptWait(Workflow):
    name = "exec_bad_reattempt_wait"

    @step
    def act(self):
        self.reattempt(wait="soon")


# -- a run, its outputs and its audit trail --------------------------------------------------


def test_three_steps_run_to_the_end_and_store_each_output(order):
    wf = ExecThree.start(order)

    assert run_due_steps(limit=10, claimed_by="worker-1") == 3

    wf.reload()
    assert wf.status == "finished"
    assert wf.record.finished_at is not None
    rows = steps_of(wf)
    assert [(s.step_name, s.attempt, s.status, s.outcome) for s in rows] == [
        ("one", 1, "completed", "success"),
        ("two", 1, "completed", "success"),
        ("three", 1, "completed", "success"),
    ]
    assert [s.output for s in rows] == [{"n": 1}, {"n": 2, "seen": ["one"]}, None]
    assert {s.claimed_by for s in rows} == {"worker-1"}
    assert labels() == ["three saw n=2"]


def test_the_events_form_the_path_started_claim_advance_finish(order):
    wf = ExecThree.start(order)
    run_due_steps(limit=10, claimed_by="worker-1")

    events = list(WorkflowEvent.objects.filter(run_id=wf.record.pk).order_by("pk"))
    assert [(e.kind, e.transition, e.from_status, e.to_status) for e in events] == [
        ("started", "", "", "ready"),
        ("step_started", "claim", "ready", "performing"),
        ("step_completed", "advance", "performing", "ready"),
        ("step_started", "claim", "ready", "performing"),
        ("step_completed", "advance", "performing", "ready"),
        ("step_started", "claim", "ready", "performing"),
        ("finished", "finish", "performing", "finished"),
    ]
    assert [e.step.step_name if e.step else None for e in events] == [
        None,
        "one",
        "one",
        "two",
        "two",
        "three",
        "three",
    ]
    assert events[1].details == {"attempt": 1, "claimed_by": "worker-1"}
    assert events[2].details["next_step"] == "two"
    assert events[4].details["next_step"] == "three"


def test_a_claim_moves_the_attempt_to_in_progress_and_the_run_to_performing(order):
    wf = ExecThree.start(order)

    [claimed] = claim_due_steps(10, claimed_by="worker-7")

    row = WorkflowStep.objects.get(pk=claimed.pk)
    assert (row.step_name, row.status, row.claimed_by) == ("one", "in_progress", "worker-7")
    assert row.started_at is not None
    assert wf.reload().status == "performing"
    outcome = execute_step(claimed)
    assert outcome.kind == "success"
    assert wf.reload().status == "ready"
    assert scheduled(wf).step_name == "two"


# -- when a step is due ----------------------------------------------------------------------


def test_wait_delays_the_next_step_until_run_now(order):
    wf = ExecWait.start(order)
    [first] = claim_due_steps(10)
    execute_step(first)

    later = scheduled(wf)
    assert later.step_name == "later"
    assert later.scheduled_at - later.created_at == timedelta(hours=2)
    assert claim_due_steps(10) == []
    assert labels() == ["first"]

    wf.run_now(actor="alice")

    [claimed] = claim_due_steps(10)
    assert claimed.pk == later.pk
    execute_step(claimed)
    assert wf.reload().status == "finished"
    assert labels() == ["first", "later"]


def test_a_step_due_only_when_its_scheduled_at_is_reached(order):
    wf = ExecWait.start(order)
    execute_step(claim_due_steps(10)[0])
    later = scheduled(wf)

    WorkflowStep.objects.filter(pk=later.pk).update(scheduled_at=timezone.now() - timedelta(seconds=1))

    assert [s.pk for s in claim_due_steps(10)] == [later.pk]


def test_a_callable_wait_is_asked_with_the_attempt_number(order):
    wf = ExecCallableWait.start(order)
    run_next(wf)  # prepare
    remind = scheduled(wf)
    assert (remind.step_name, remind.attempt) == ("remind", 1)
    assert remind.scheduled_at - remind.created_at == timedelta(minutes=5)

    run_next(wf)  # remind attempt 1 pauses the run
    assert wf.status == "paused"
    wf.resume_at("prepare", actor="alice")
    run_next(wf)  # prepare again: remind is scheduled for its second attempt

    remind = scheduled(wf)
    assert (remind.step_name, remind.attempt) == ("remind", 2)
    assert remind.scheduled_at - remind.created_at == timedelta(minutes=10)
    assert labels() == ["prepare 1", "prepare 2"]


def test_claims_go_by_priority_then_scheduled_at():
    now = timezone.now()
    older_low = ExecPrioLow.start()
    newer_low = ExecPrioLow.start()
    high = ExecPrioHigh.start()  # started last, but priority -1 beats 10
    WorkflowStep.objects.filter(run_id=older_low.record.pk).update(scheduled_at=now - timedelta(minutes=10))
    WorkflowStep.objects.filter(run_id=newer_low.record.pk).update(scheduled_at=now - timedelta(minutes=5))
    assert scheduled(high).priority == -1
    assert scheduled(older_low).priority == 10

    first = claim_due_steps(1)
    second = claim_due_steps(1)
    third = claim_due_steps(1)

    assert [s.run_id for s in first + second + third] == [high.record.pk, older_low.record.pk, newer_low.record.pk]
    assert claim_due_steps(1) == []


def test_one_claim_returns_its_batch_in_priority_order():
    now = timezone.now()
    low = ExecPrioLow.start()
    high = ExecPrioHigh.start()
    WorkflowStep.objects.filter(run_id=low.record.pk).update(scheduled_at=now - timedelta(hours=1))

    claimed = claim_due_steps(10)

    assert [s.run_id for s in claimed] == [high.record.pk, low.record.pk]


def test_queue_filtering_claims_only_the_named_queues():
    mail = ExecMailQueue.start()
    default = ExecDefaultQueue.start()
    assert scheduled(mail).queue == "exec_mail"
    assert scheduled(default).queue == "workflows"

    assert claim_due_steps(10, queues=["exec_elsewhere"]) == []
    mail_claims = claim_due_steps(10, queues=["exec_mail"])
    assert [s.run_id for s in mail_claims] == [mail.record.pk]
    assert [s.run_id for s in claim_due_steps(10, queues=["workflows", "exec_mail"])] == [default.record.pk]


def test_run_due_steps_runs_only_its_queues():
    mail = ExecMailQueue.start()
    default = ExecDefaultQueue.start()

    assert run_due_steps(limit=10, queues=["exec_mail"]) == 1

    assert mail.reload().status == "finished"
    assert default.reload().status == "ready"
    assert labels() == ["mail"]


# -- claims that do nothing ------------------------------------------------------------------


def test_a_duplicate_claim_is_a_no_op(order):
    wf = ExecThree.start(order)
    step_pk = scheduled(wf).pk

    first = claim_step(step_pk, "worker-1")
    second = claim_step(step_pk, "worker-2")

    assert first is not None and first.pk == step_pk
    assert second is None
    assert claim_due_steps(10) == []
    row = WorkflowStep.objects.get(pk=step_pk)
    assert (row.status, row.claimed_by) == ("in_progress", "worker-1")
    assert WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="step_started").count() == 1


def test_executing_an_attempt_twice_runs_its_body_once(order):
    wf = ExecSubject.start(order)
    claimed = claim_step(scheduled(wf).pk, "worker-1")
    execute_step(claimed)

    outcome = execute_step(claimed)

    assert labels() == ["touched"]
    assert outcome is None
    assert wf.reload().status == "finished"


def test_a_claimed_attempt_of_a_run_cancelled_before_it_started_does_not_run(order):
    wf = ExecSubject.start(order)
    [claimed] = claim_due_steps(10)  # a dispatcher claimed a batch, runs it one by one
    wf.cancel(actor="bob", reason="customer asked")  # meanwhile, an operator cancels

    outcome = execute_step(claimed)

    assert labels() == []  # the body never started: no side effect after the cancel
    assert outcome is None
    assert WorkflowStep.objects.get(pk=claimed.pk).status == "cancelled"
    assert wf.reload().status == "cancelled"


def test_a_paused_runs_due_step_is_not_claimed(order):
    wf = ExecThree.start(order)
    step_pk = scheduled(wf).pk
    wf.pause(actor="alice", reason="hold on")

    assert claim_due_steps(10) == []
    assert claim_step(step_pk, "worker-1") is None
    assert WorkflowStep.objects.get(pk=step_pk).status == "scheduled"

    wf.resume(actor="alice")
    assert [s.pk for s in claim_due_steps(10)] == [step_pk]


def test_claim_of_a_step_of_a_finished_run_is_a_no_op(order):
    wf = ExecSubject.start(order)
    step_pk = scheduled(wf).pk
    wf.cancel(actor="bob")

    assert claim_step(step_pk, "worker-1") is None
    assert claim_due_steps(10) == []


# -- stall_at --------------------------------------------------------------------------------


def test_stall_at_is_started_at_plus_the_stall_threshold(order, settings):
    wf = ExecTimeouts.start(order)
    [claimed] = claim_due_steps(10)
    assert claimed.stall_at - claimed.started_at == timedelta(hours=1)  # STALL_THRESHOLD default
    execute_step(claimed)

    settings.PGBUS_WORKFLOWS = {**settings.PGBUS_WORKFLOWS, "STALL_THRESHOLD": 120}
    bounded = scheduled(wf)
    assert bounded.timeout == timedelta(minutes=5)
    [claimed] = claim_due_steps(10)
    row = WorkflowStep.objects.get(pk=claimed.pk)
    assert row.stall_at - row.started_at == timedelta(minutes=5)  # timeout= wins over the threshold


def test_stall_at_follows_the_configured_stall_threshold(order, settings):
    settings.PGBUS_WORKFLOWS = {**settings.PGBUS_WORKFLOWS, "STALL_THRESHOLD": 120}
    ExecTimeouts.start(order)

    [claimed] = claim_due_steps(10)

    row = WorkflowStep.objects.get(pk=claimed.pk)
    assert row.stall_at - row.started_at == timedelta(minutes=2)


# -- the guards, in order --------------------------------------------------------------------


def test_a_deleted_subject_cancels_the_run(order):
    wf = ExecSubject.start(order)
    order.delete()

    row = run_next(wf)

    assert wf.status == "cancelled"
    assert (row.status, row.outcome) == ("cancelled", "cancelled")
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="cancelled")
    assert (event.transition, event.from_status, event.to_status) == ("cancel", "performing", "cancelled")
    assert "no longer exists" in event.reason
    assert labels() == []


def test_allow_missing_subject_keeps_going(order):
    wf = ExecSubjectOptional.start(order)
    order.delete()

    row = run_next(wf)

    assert wf.status == "finished"
    assert (row.status, row.outcome) == ("completed", "success")
    assert labels() == ["touched subject=None"]


def test_cancel_if_cancels_the_run_before_skip_if(order):
    order.status = "void"
    order.save()
    wf = ExecCancelIf.start(order)

    row = run_next(wf)

    assert wf.status == "cancelled"
    assert (row.step_name, row.status, row.outcome) == ("first", "cancelled", "cancelled")
    assert WorkflowEvent.objects.get(run_id=wf.record.pk, kind="cancelled").reason == "cancel_if"
    assert not WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="step_skipped").exists()
    assert labels() == []


def test_the_subject_guard_runs_before_cancel_if(order):
    wf = ExecCancelIf.start(order)
    order.delete()  # cancel_if would raise AttributeError on a None subject

    row = run_next(wf)

    assert wf.status == "cancelled"
    assert row.error_class == ""
    assert "no longer exists" in WorkflowEvent.objects.get(run_id=wf.record.pk, kind="cancelled").reason


def test_cancel_if_false_lets_the_steps_run(order):
    wf = ExecCancelIf.start(order)

    run_next(wf)  # first: skip_if=True
    run_next(wf)  # second

    assert wf.status == "finished"
    assert labels() == ["second"]


def test_skip_if_as_callable_method_name_and_bool_skips_and_schedules_the_next(order):
    order.reviewed = True
    order.save()
    wf = ExecSkipIf.start(order, done=True)

    rows = [run_next(wf) for _ in range(4)]

    assert wf.status == "finished"
    assert [(r.step_name, r.status, r.outcome) for r in rows] == [
        ("by_callable", "skipped", "skipped"),
        ("by_method_name", "skipped", "skipped"),
        ("by_bool", "skipped", "skipped"),
        ("never_skipped", "completed", "success"),
    ]
    skipped = WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="step_skipped").order_by("pk")
    assert [(e.reason, e.details["next_step"], e.transition, e.to_status) for e in skipped] == [
        ("skip_if", "by_method_name", "advance", "ready"),
        ("skip_if", "by_bool", "advance", "ready"),
        ("skip_if", "never_skipped", "advance", "ready"),
    ]
    assert labels() == ["never_skipped"]


def test_skip_if_false_runs_the_body(order):
    wf = ExecSkipIf.start(order, done=False)

    rows = [run_next(wf) for _ in range(4)]

    assert [r.status for r in rows] == ["completed", "completed", "skipped", "completed"]
    assert labels() == ["by_callable", "by_method_name", "never_skipped"]


def test_an_exception_in_cancel_if_goes_to_the_policy_as_a_precondition(order):
    wf = ExecCancelIfBoom.start(order)

    first = run_next(wf)

    assert (first.outcome, first.reattempt_reason) == ("reattempted", "precondition")
    assert first.error_class == "tests.services.test_executor.ExecGuardError"
    assert first.error_message == "cancel_if broke"
    assert (scheduled(wf).attempt, wf.status) == (2, "ready")

    second = run_next(wf)
    third = run_next(wf)  # max_reattempts=2: precondition reattempts count

    assert second.reattempt_reason == "precondition"
    assert (third.status, third.outcome) == ("failed", "failed")
    assert wf.status == "paused"
    assert labels() == []


def test_an_exception_in_skip_if_goes_to_the_default_policy(order):
    wf = ExecSkipIfBoom.start(order)

    row = run_next(wf)

    assert wf.status == "paused"
    assert (row.status, row.outcome) == ("failed", "failed")
    assert row.error_class.endswith("ExecGuardError")
    assert "skip_if broke" in wf.record.paused_reason
    assert labels() == []


def _reschedule_as(wf, step_name):
    """Replace the run's scheduled attempt by one for ``step_name`` (a row written directly)."""
    WorkflowStep.objects.filter(run_id=wf.record.pk, status="scheduled").delete()
    WorkflowRun.objects.filter(pk=wf.record.pk).update(current_step=step_name)
    return WorkflowStep.objects.create(run=wf.record, step_name=step_name, queue="workflows")


def test_an_unknown_step_pauses_the_run_with_step_not_defined(order):
    wf = ExecKnown.start(order)
    ghost = _reschedule_as(wf, "ghost")

    assert claim_due_steps(10) == []  # a dispatcher leaves it for code that defines it
    claimed = claim_step(ghost.pk)  # the test helpers run it at once: in a test the code is complete
    execute_step(claimed)

    wf.reload()
    row = WorkflowStep.objects.get(pk=ghost.pk)
    assert wf.status == "paused"
    assert (row.status, row.outcome) == ("failed", "failed")
    assert row.error_class.endswith("StepNotDefined")
    assert "ghost" in row.error_message
    assert "StepNotDefined" in wf.record.paused_reason
    assert labels() == []


def test_the_subject_guard_runs_before_the_step_definition_check(order):
    wf = ExecKnown.start(order)
    _reschedule_as(wf, "ghost")
    order.delete()

    run_next(wf)

    assert wf.status == "cancelled"


def test_a_removed_step_in_flight_is_skipped_and_the_run_goes_on(order):
    passing = ExecGravestone.start(order)
    assert [r.step_name for r in (run_next(passing), run_next(passing))] == ["first", "last"]  # passed over

    wf = ExecGravestone.start(order)
    run_next(wf)  # first
    gravestone = _reschedule_as(wf, "old_reminder")
    assert ExecGravestone.removed_steps_in_flight() == {"old_reminder": 1}

    run_next(wf)

    row = WorkflowStep.objects.get(pk=gravestone.pk)
    assert (row.status, row.outcome) == ("skipped", "skipped")
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="step_skipped")
    assert event.details["removed"] is True
    assert event.details["next_step"] == "last"
    assert wf.status == "ready"
    assert scheduled(wf).step_name == "last"
    assert ExecGravestone.removed_steps_in_flight() == {"old_reminder": 0}

    run_next(wf)
    assert wf.status == "finished"
    assert labels() == ["first", "last", "first", "last"]


def test_a_run_of_an_unregistered_class_pauses_with_step_not_defined():
    run = WorkflowRun.objects.create(workflow_class="exec_class_that_was_deleted", current_step="gone")
    step_row = WorkflowStep.objects.create(run=run, step_name="gone", queue="workflows")

    assert claim_due_steps(10) == []
    claimed = claim_step(step_row.pk)
    execute_step(claimed)

    run.refresh_from_db()
    step_row.refresh_from_db()
    assert run.status == "paused"
    assert (step_row.status, step_row.outcome) == ("failed", "failed")
    assert step_row.error_class.endswith("StepNotDefined")
    assert "not registered" in step_row.error_message
    handle = Workflow.find(run.workflow_id)
    assert type(handle) is Workflow
    assert handle.status == "paused"


# -- the verbs of a step body ----------------------------------------------------------------


def test_reattempt_schedules_the_same_step_again_after_its_wait():
    wf = ExecVerbs.start(verb="reattempt")

    first = run_next(wf)

    assert (first.status, first.outcome, first.reattempt_reason) == ("completed", "reattempted", "flow_control")
    second = scheduled(wf)
    assert (second.step_name, second.attempt) == ("act", 2)
    assert second.scheduled_at - first.finished_at == timedelta(minutes=3)
    assert wf.status == "ready"
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="step_reattempted")
    assert event.details["next_attempt"] == 2
    assert event.details["wait_seconds"] == 180
    assert claim_due_steps(10) == []
    assert labels() == ["before reattempt attempt 1"]  # the code after reattempt() did not run

    wf.run_now()
    execute_step(claim_due_steps(10)[0])

    assert WorkflowStep.objects.get(pk=second.pk).outcome == "success"
    assert labels() == ["before reattempt attempt 1", "before reattempt attempt 2", "after reattempt"]


def test_voluntary_reattempts_do_not_count_toward_max_reattempts():
    wf = ExecVoluntary.start()

    rows = [run_next(wf) for _ in range(5)]

    # three voluntary reattempts, then the first error is reattempted (max_reattempts=1)
    assert [(r.outcome, r.reattempt_reason) for r in rows] == [
        ("reattempted", "flow_control"),
        ("reattempted", "flow_control"),
        ("reattempted", "flow_control"),
        ("reattempted", "exception_policy"),
        ("failed", ""),
    ]
    assert wf.status == "paused"


def test_finished_finishes_the_run_and_later_steps_do_not_run():
    wf = ExecVerbs.start(verb="finished")

    row = run_next(wf)

    assert wf.status == "finished"
    assert (row.status, row.outcome) == ("completed", "success")
    assert list(WorkflowStep.objects.filter(run_id=wf.record.pk).values_list("step_name", flat=True)) == ["act"]
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="finished")
    assert (event.transition, event.from_status) == ("finish", "performing")
    assert labels() == ["before finished attempt 1"]


def test_skip_skips_the_step_and_schedules_the_next():
    wf = ExecVerbs.start(verb="skip")

    row = run_next(wf)

    assert (row.status, row.outcome) == ("skipped", "skipped")
    assert (wf.status, scheduled(wf).step_name) == ("ready", "follow")
    run_next(wf)
    assert wf.status == "finished"
    assert labels() == ["before skip attempt 1", "follow saw None"]


def test_pause_pauses_the_run_and_resume_reruns_the_same_step():
    wf = ExecVerbs.start(verb="pause")

    row = run_next(wf)

    assert (row.status, row.outcome) == ("cancelled", "paused")
    assert wf.status == "paused"
    assert wf.record.paused_reason == "needs a human"
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="paused")
    assert (event.transition, event.from_status, event.to_status) == ("step_pause", "performing", "paused")
    assert event.reason == "needs a human"
    assert claim_due_steps(10) == []

    wf.resume(actor="alice")

    again = scheduled(wf)
    assert (again.step_name, again.attempt) == ("act", 2)
    assert run_next(wf).outcome == "success"
    assert scheduled(wf).step_name == "follow"
    assert labels() == ["before pause attempt 1", "before pause attempt 2", "after pause"]


def test_cancel_cancels_the_run():
    wf = ExecVerbs.start(verb="cancel")

    row = run_next(wf)

    assert (row.status, row.outcome) == ("cancelled", "cancelled")
    assert wf.status == "cancelled"
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="cancelled")
    assert (event.reason, event.transition) == ("not wanted", "cancel")
    assert not WorkflowStep.objects.filter(run_id=wf.record.pk, step_name="follow").exists()
    assert labels() == ["before cancel attempt 1"]


def test_output_ends_the_body_with_its_value():
    wf = ExecVerbs.start(verb="output")

    row = run_next(wf)
    run_next(wf)

    assert (row.outcome, row.output) == ("success", {"early": True})
    assert labels() == ["before output attempt 1", "follow saw {'early': True}"]


def test_returning_a_value_is_the_output():
    wf = ExecVerbs.start(verb="none")

    row = run_next(wf)

    assert row.output == {"late": True}
    assert labels() == ["before none attempt 1", "after none"]


@pytest.mark.parametrize(
    "use",
    [
        pytest.param(lambda wf: wf.step_idempotency_key, id="step_idempotency_key"),
        pytest.param(lambda wf: wf.attempt, id="attempt"),
        pytest.param(lambda wf: wf.received_signal, id="received_signal"),
        pytest.param(lambda wf: wf.timed_out, id="timed_out"),
        pytest.param(lambda wf: wf.reattempt(), id="reattempt"),
        pytest.param(lambda wf: wf.reattempt(wait=5), id="reattempt_wait"),
        pytest.param(lambda wf: wf.finished(), id="finished"),
        pytest.param(lambda wf: wf.output({"a": 1}), id="output"),
    ],
)
def test_step_only_readers_and_verbs_raise_not_in_step_outside_a_body(use):
    wf = ExecVerbs.start(verb="none")

    with pytest.raises(NotInStep):
        use(wf)

    assert wf.reload().status == "ready"
    assert scheduled(wf).attempt == 1


def test_step_idempotency_key_is_stable_across_reattempts_and_differs_per_step():
    wf = ExecKey.start()
    other = ExecKey.start()

    for _ in range(3):
        run_next(wf)
    run_next(other)

    effects = list(SideEffect.objects.order_by("pk").values_list("label", "key"))
    assert [label for label, _ in effects] == ["charge 1", "charge 2", "ship", "charge 1"]
    charge_1, charge_2, ship, other_charge = (key for _, key in effects)
    assert charge_1 == charge_2
    assert str(wf.workflow_id) in charge_1
    assert ship != charge_1
    assert other_charge != charge_1


def test_an_output_too_large_becomes_an_error_through_the_policy():
    wf = ExecTooLarge.start()

    row = run_next(wf)

    assert wf.status == "paused"
    assert (row.status, row.outcome) == ("failed", "failed")
    assert row.error_class.endswith("PayloadTooLarge")
    assert "4096" in row.error_message
    assert row.output is None


def test_an_output_given_to_output_too_large_becomes_an_error():
    wf = ExecTooLarge.start(via_output=True)

    row = run_next(wf)

    assert wf.status == "paused"
    assert row.error_class.endswith("PayloadTooLarge")


def test_an_output_that_is_not_json_becomes_an_error_through_the_policy():
    wf = ExecNotJson.start()

    row = run_next(wf)

    # the step's on_exception="skip" applied to the encoding error
    assert (row.status, row.outcome) == ("skipped", "skipped")
    assert row.error_class.endswith("PayloadNotSerializable")
    assert row.output is None
    assert scheduled(wf).step_name == "after"


def test_error_class_message_and_traceback_are_kept_on_the_failed_attempt():
    wf = ExecErrors.start()

    row = run_next(wf)

    assert (row.status, row.outcome) == ("failed", "failed")
    assert row.error_class == "tests.services.test_executor.ExecBoomError"
    assert row.error_message == "boom 42"
    assert "Traceback (most recent call last)" in row.traceback
    assert "_explode" in row.traceback
    assert "ExecBoomError: boom 42" in row.traceback
    assert wf.record.paused_reason == "tests.services.test_executor.ExecBoomError: boom 42"


def test_a_builtin_error_class_is_stored_by_its_plain_name():
    wf = ExecErrors.start(builtin=True)

    row = run_next(wf)

    assert (row.error_class, row.error_message) == ("ValueError", "bad value 7")


@pytest.mark.parametrize(
    ("verb", "status", "outcome", "output", "run_status"),
    [
        ("skip", "skipped", "skipped", None, "ready"),
        ("finished", "completed", "success", None, "finished"),
        ("output", "completed", "success", {"via": "output"}, "ready"),
    ],
)
def test_except_exception_in_the_body_does_not_swallow_a_verb(verb, status, outcome, output, run_status):
    wf = ExecSwallow.start(verb=verb)

    row = run_next(wf)

    assert (row.status, row.outcome, row.output) == (status, outcome, output)
    assert wf.status == run_status
    assert labels() == []


def test_an_invalid_reattempt_wait_becomes_an_error_not_an_escape():
    wf = ExecBadReattemptWait.start()
    claimed = claim_step(scheduled(wf).pk, "worker-1")

    execute_step(claimed)  # must not raise: "exceptions from the body never escape"

    row = WorkflowStep.objects.get(pk=claimed.pk)
    assert row.status == "failed"
    assert row.error_class.endswith("ConfigurationError")
    assert wf.reload().status == "paused"


def test_run_due_steps_runs_until_nothing_is_due_and_counts_the_steps():
    first = ExecThree.start(Order.objects.create())
    second = ExecThree.start(Order.objects.create())

    assert run_due_steps(limit=100) == 6
    assert run_due_steps(limit=100) == 0

    assert first.reload().status == second.reload().status == "finished"
