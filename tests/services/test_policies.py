"""Exception policies as the executor applies them when a step body raises."""

import json
from datetime import timedelta

import pytest

from pgbus_workflows import OnException, Workflow, step
from pgbus_workflows.models import WorkflowEvent, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from tests.support import run_next, scheduled, steps_of

pytestmark = pytest.mark.django_db


class PolError(Exception):
    """The error the bodies of this file raise on purpose."""


class PolChildError(PolError):
    """A subclass: policies for PolError match it too."""


class PolOtherError(Exception):
    """An error no specific policy names."""


ERRORS = {
    "pol": PolError,
    "child": PolChildError,
    "other": PolOtherError,
    "value": ValueError,
    "json": lambda message: json.JSONDecodeError(message, "{", 0),
}


def raise_chosen(wf):
    """Raise the error named by the run's ``error`` argument."""
    raise ERRORS[wf.arguments.get("error", "pol")]("kaboom")


# -- workflows -------------------------------------------------------------------------------


class PolDefault(Workflow):
    name = "pol_default"

    @step
    def boom(self):
        raise_chosen(self)

    @step
    def after(self):
        pass


class PolStepActions(Workflow):
    name = "pol_step_actions"
    allow_multiple = True

    @step(on_exception="cancel")
    def cancels(self):
        if self.arguments["step"] == "cancels":
            raise_chosen(self)

    @step(on_exception="skip")
    def skips(self):
        if self.arguments["step"] == "skips":
            raise_chosen(self)

    @step(on_exception="reattempt")
    def reattempts(self):
        if self.arguments["step"] == "reattempts" and self.attempt == 1:
            raise_chosen(self)
        return {"attempt": self.attempt}


class PolWaits(Workflow):
    name = "pol_waits"

    @step(on_exception=OnException(action="reattempt", wait=timedelta(minutes=10)))
    def fixed(self):
        if self.attempt == 1:
            raise_chosen(self)

    @step(on_exception=OnException(action="reattempt", wait=lambda n: timedelta(seconds=30 * n)))
    def growing(self):
        if self.attempt <= 2:
            raise_chosen(self)


class PolMax(Workflow):
    name = "pol_max"
    exception_policies = [OnException(PolError, action="reattempt", max_reattempts=3)]

    @step
    def always_fails(self):
        raise_chosen(self)


class PolMaxCancel(Workflow):
    name = "pol_max_cancel"
    exception_policies = [OnException(PolError, action="reattempt", max_reattempts=3, terminal_action="cancel")]

    @step
    def always_fails(self):
        raise_chosen(self)


class PolStepMax(Workflow):
    name = "pol_step_max"

    @step(on_exception="reattempt", max_reattempts=2)
    def always_fails(self):
        raise_chosen(self)


def follow_plan(wf):
    """Do what the ``plan`` argument says for this attempt: raise, reattempt or succeed."""
    action = wf.arguments["plan"][wf.attempt - 1]
    if action == "raise":
        raise PolError(f"attempt {wf.attempt}")
    if action == "reattempt":
        wf.reattempt()
    return {"attempt": wf.attempt}


class PolVoluntaryBetween(Workflow):
    name = "pol_voluntary_between"

    @step(on_exception="reattempt", max_reattempts=2)
    def work(self):
        return follow_plan(self)


class PolSuccessResets(Workflow):
    name = "pol_success_resets"

    @step(on_exception="reattempt", max_reattempts=2)
    def work(self):
        return follow_plan(self)

    @step
    def check(self):
        if self.attempt == 1:
            self.pause("look at work again")


class PolSpecificBeforeBlanket(Workflow):
    name = "pol_specific_before_blanket"
    allow_multiple = True
    # the blanket policy is the newest, yet a matching specific policy comes first
    exception_policies = [OnException(PolError, action="skip"), OnException(action="cancel")]

    @step
    def boom(self):
        raise_chosen(self)

    @step
    def after(self):
        pass


class PolNewestFirst(Workflow):
    name = "pol_newest_first"
    allow_multiple = True
    exception_policies = [
        OnException(PolError, action="cancel"),
        OnException(action="skip"),
        OnException(PolError, action="skip"),  # newer specific: wins over the older one
        OnException(action="cancel"),  # newer blanket: wins over the older one
    ]

    @step
    def boom(self):
        raise_chosen(self)

    @step
    def after(self):
        pass


class PolParent(Workflow):
    name = "pol_parent"
    allow_multiple = True
    exception_policies = [OnException(PolError, action="cancel"), OnException(PolOtherError, action="cancel")]

    @step
    def boom(self):
        raise_chosen(self)

    @step
    def after(self):
        pass


class PolChild(PolParent):
    name = "pol_child"
    exception_policies = [OnException(PolError, action="skip"), OnException(action="skip")]


class PolStepWins(Workflow):
    name = "pol_step_wins"
    exception_policies = [OnException(PolError, action="cancel"), OnException(action="cancel")]

    @step(on_exception="skip")
    def skipped(self):
        raise_chosen(self)

    @step(on_exception="pause")
    def paused(self):
        raise_chosen(self)


class PolDotted(Workflow):
    name = "pol_dotted"
    allow_multiple = True
    exception_policies = [
        OnException("json.JSONDecodeError", action="skip"),
        OnException("tests.services.test_policies.PolError", action="skip"),
        OnException("tests.no_such_module.MissingError", action="cancel"),  # matches nothing
    ]

    @step
    def boom(self):
        raise_chosen(self)

    @step
    def after(self):
        pass


# -- the default and the step's own actions --------------------------------------------------


def test_the_default_policy_pauses_the_run_with_the_error_as_reason():
    wf = PolDefault.start()

    row = run_next(wf)

    assert (row.status, row.outcome) == ("failed", "failed")
    assert wf.status == "paused"
    assert wf.record.paused_reason == "tests.services.test_policies.PolError: kaboom"
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="step_failed")
    assert (event.transition, event.from_status, event.to_status) == ("hold", "performing", "paused")
    assert event.details["action"] == "pause"
    assert event.details["error_class"] == "tests.services.test_policies.PolError"
    assert len(steps_of(wf)) == 1
    assert claim_due_steps(10) == []


def test_on_exception_cancel_cancels_the_run():
    wf = PolStepActions.start(step="cancels")

    row = run_next(wf)

    assert (row.status, row.outcome) == ("failed", "cancelled")
    assert row.error_class == "tests.services.test_policies.PolError"
    assert wf.status == "cancelled"
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="step_failed")
    assert (event.transition, event.to_status, event.details["action"]) == ("cancel", "cancelled", "cancel")


def test_on_exception_skip_skips_the_step_and_schedules_the_next():
    wf = PolStepActions.start(step="skips")
    run_next(wf)  # cancels: no error

    row = run_next(wf)

    assert (row.step_name, row.status, row.outcome) == ("skips", "skipped", "skipped")
    assert (row.error_class, row.error_message) == ("tests.services.test_policies.PolError", "kaboom")
    assert wf.status == "ready"
    assert scheduled(wf).step_name == "reattempts"
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="step_skipped")
    assert event.details["action"] == "skip"


def test_on_exception_reattempt_writes_a_new_attempt_row():
    wf = PolStepActions.start(step="reattempts")
    run_next(wf)
    run_next(wf)

    first = run_next(wf)

    assert (first.step_name, first.attempt) == ("reattempts", 1)
    assert (first.outcome, first.reattempt_reason) == ("reattempted", "exception_policy")
    assert first.error_class == "tests.services.test_policies.PolError"
    second = scheduled(wf)
    assert (second.step_name, second.attempt) == ("reattempts", 2)
    assert second.scheduled_at == first.finished_at  # no wait: due at once
    assert wf.status == "ready"
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="step_reattempted")
    assert (event.transition, event.details["next_attempt"]) == ("advance", 2)

    [claimed] = claim_due_steps(10)
    assert claimed.pk == second.pk
    execute_step(claimed)
    assert WorkflowStep.objects.get(pk=second.pk).output == {"attempt": 2}
    assert wf.reload().status == "finished"


def test_a_policy_wait_delays_the_reattempt():
    wf = PolWaits.start()

    first = run_next(wf)

    second = scheduled(wf)
    assert second.attempt == 2
    assert second.scheduled_at - first.finished_at == timedelta(minutes=10)
    assert claim_due_steps(10) == []
    wf.run_now(actor="alice")
    [claimed] = claim_due_steps(10)
    assert claimed.pk == second.pk


def test_a_callable_policy_wait_gets_the_error_reattempt_count():
    wf = PolWaits.start()
    run_next(wf)  # fixed, attempt 1 fails
    run_next(wf)  # fixed, attempt 2 succeeds

    waits = []
    for _ in range(2):
        failed = run_next(wf)
        waits.append(scheduled(wf).scheduled_at - failed.finished_at)
    run_next(wf)

    assert waits == [timedelta(seconds=30), timedelta(seconds=60)]
    assert wf.status == "finished"


# -- max_reattempts --------------------------------------------------------------------------


def test_max_reattempts_three_means_three_reattempts_then_the_fourth_failure_pauses():
    wf = PolMax.start()

    rows = [run_next(wf) for _ in range(4)]

    assert [(r.attempt, r.outcome, r.reattempt_reason) for r in rows] == [
        (1, "reattempted", "exception_policy"),
        (2, "reattempted", "exception_policy"),
        (3, "reattempted", "exception_policy"),
        (4, "failed", ""),
    ]
    assert rows[3].status == "failed"
    assert rows[3].error_class == "tests.services.test_policies.PolError"
    assert wf.status == "paused"
    assert len(steps_of(wf)) == 4
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="step_failed")
    assert (event.details["reattempts_exhausted"], event.details["action"]) == (3, "pause")


def test_max_reattempts_with_terminal_cancel_cancels_the_run():
    wf = PolMaxCancel.start()

    rows = [run_next(wf) for _ in range(4)]

    assert [r.outcome for r in rows] == ["reattempted", "reattempted", "reattempted", "cancelled"]
    assert rows[3].status == "failed"
    assert wf.status == "cancelled"
    assert len(steps_of(wf)) == 4


def test_step_level_max_reattempts():
    wf = PolStepMax.start()

    rows = [run_next(wf) for _ in range(3)]

    assert [r.outcome for r in rows] == ["reattempted", "reattempted", "failed"]
    assert wf.status == "paused"


def test_voluntary_reattempts_in_between_do_not_count():
    wf = PolVoluntaryBetween.start(plan=["raise", "reattempt", "raise", "reattempt", "raise"])

    rows = [run_next(wf) for _ in range(5)]

    assert [(r.outcome, r.reattempt_reason) for r in rows] == [
        ("reattempted", "exception_policy"),
        ("reattempted", "flow_control"),
        ("reattempted", "exception_policy"),
        ("reattempted", "flow_control"),
        ("failed", ""),  # the third error: max_reattempts=2 is exhausted
    ]
    assert wf.status == "paused"


def test_a_success_in_between_resets_the_count():
    wf = PolSuccessResets.start(plan=["raise", "raise", "ok", "raise", "raise", "ok"])
    for _ in range(3):
        run_next(wf)  # work: two error reattempts, then success
    run_next(wf)  # check pauses the run
    assert wf.status == "paused"
    wf.resume_at("work", actor="alice")

    rows = [run_next(wf) for _ in range(3)]

    # without the reset the first failure here would be the third consecutive error: a pause
    assert [(r.attempt, r.outcome) for r in rows] == [(4, "reattempted"), (5, "reattempted"), (6, "success")]
    assert wf.status == "ready"
    assert scheduled(wf).step_name == "check"


# -- class-level policies --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workflow", "error", "outcome", "run_status"),
    [
        pytest.param(PolSpecificBeforeBlanket, "pol", "skipped", "ready", id="specific-before-newer-blanket"),
        pytest.param(PolSpecificBeforeBlanket, "child", "skipped", "ready", id="specific-matches-subclass"),
        pytest.param(PolSpecificBeforeBlanket, "other", "cancelled", "cancelled", id="blanket-when-none-matches"),
        pytest.param(PolNewestFirst, "pol", "skipped", "ready", id="newest-specific-first"),
        pytest.param(PolNewestFirst, "other", "cancelled", "cancelled", id="newest-blanket-first"),
        pytest.param(PolParent, "pol", "cancelled", "cancelled", id="parent-alone"),
        pytest.param(PolChild, "pol", "skipped", "ready", id="subclass-before-parent"),
        pytest.param(PolChild, "other", "cancelled", "cancelled", id="parent-specific-before-child-blanket"),
        pytest.param(PolChild, "value", "skipped", "ready", id="child-blanket"),
        pytest.param(PolDotted, "json", "skipped", "ready", id="dotted-string-class"),
        pytest.param(PolDotted, "child", "skipped", "ready", id="dotted-string-subclass"),
        pytest.param(PolDotted, "other", "failed", "paused", id="missing-dotted-class-matches-nothing"),
    ],
)
def test_class_level_policy_resolution(workflow, error, outcome, run_status):
    wf = workflow.start(error=error)

    row = run_next(wf)

    assert row.step_name == "boom"
    assert row.outcome == outcome
    assert wf.status == run_status
    assert row.error_message.startswith("kaboom")


def test_a_subclass_does_not_change_its_parents_policies():
    assert [p.action for p in PolParent.exception_policies] == ["cancel", "cancel"]
    wf = PolParent.start(error="value")

    row = run_next(wf)

    assert (row.outcome, wf.status) == ("failed", "paused")  # no blanket on the parent: the default


def test_the_steps_own_policy_wins_over_the_class_policies():
    wf = PolStepWins.start()

    skipped = run_next(wf)
    paused = run_next(wf)

    assert (skipped.step_name, skipped.outcome) == ("skipped", "skipped")
    assert (paused.step_name, paused.outcome) == ("paused", "failed")  # on_exception="pause" beats class cancel
    assert wf.status == "paused"


def test_a_reattempt_the_policy_expects_is_logged_at_info_and_the_error_that_ends_them_as_a_failure(caplog):
    wf = PolMax.start()
    caplog.clear()  # the first start of a class defined in a test module warns that it came late
    caplog.set_level("INFO", logger="pgbus_workflows")

    for _ in range(3):
        run_next(wf)
    reattempts = [r for r in caplog.records if "reattempt" in r.getMessage()]
    assert [r.levelname for r in reattempts] == ["INFO"] * 3
    assert [r.getMessage().split("; ")[-1] for r in reattempts] == [
        f"reattempt {n} of 3 in 0 s (its exception policy)" for n in (1, 2, 3)
    ]
    assert reattempts[0].getMessage().startswith("Step always_fails of pol_max ")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]

    run_next(wf)  # the fourth error: max_reattempts spent, the run pauses
    [failed] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert failed.getMessage().startswith("Step failed: pol_max ")
    assert wf.status == "paused"
