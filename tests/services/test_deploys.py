"""Deploying new code: renamed and removed steps, code that only some dispatchers have, typos caught early.

The test process runs the *new* code of ``tests/testapp/deploy_workflows.py``; where a test
needs rows written by the old code, it writes them as the old code's dispatcher would have
(``park_as_old_code``), and ``test_deploy_processes.py`` does the same with real processes.
"""

import logging
from datetime import timedelta

import pytest
from django.core.checks import Tags, run_checks
from django.test import override_settings
from django.utils import timezone

from pgbus_workflows import (
    ConfigurationError,
    NotOngoing,
    UnknownSignal,
    Workflow,
    removed_step,
    step,
)
from pgbus_workflows.conf import settings as wf_settings
from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps, claim_step
from pgbus_workflows.services.deploys import pause_unknown_steps, skip_parked_gravestones
from pgbus_workflows.services.executor import execute_step, run_due_steps
from pgbus_workflows.services.retention import delete_expired_runs
from pgbus_workflows.services.timeouts import expire_due_waits
from tests.support import labels, operation_url, run_page, statements_sent
from tests.testapp.deploy_workflows import Evolving, Retiring
from tests.testapp.models import SideEffect
from tests.testapp.workflows import Approval, Counted

pytestmark = pytest.mark.django_db


def drain():
    while run_due_steps(claimed_by="test"):
        pass


def park_as_old_code(wf, step_name, wait_for, *, timeout=None):
    """The run waits in ``step_name`` as the old code parked it (its rows, written directly)."""
    WorkflowStep.objects.filter(run_id=wf.record.pk, status__in=["scheduled", "waiting"]).delete()
    now = timezone.now()
    row = WorkflowStep.objects.create(
        run=wf.record,
        step_name=step_name,
        queue="workflows",
        status="waiting",
        wait_for=wait_for,
        waiting_since=now,
        timeout_at=None if timeout is None else now + timeout,
    )
    WorkflowRun.objects.filter(pk=wf.record.pk).update(status="waiting", current_step=step_name)
    wf.reload()
    return row


def schedule_as_old_code(wf, step_name):
    """The run's next attempt is ``step_name``, scheduled by code this process does not run."""
    WorkflowStep.objects.filter(run_id=wf.record.pk, status="scheduled").delete()
    WorkflowRun.objects.filter(pk=wf.record.pk).update(current_step=step_name)
    return WorkflowStep.objects.create(run=wf.record, step_name=step_name, queue="workflows")


# -- renamed steps -------------------------------------------------------------------------------------------


def test_a_run_waiting_on_the_old_name_continues_on_the_renamed_step():
    wf = Evolving.start()
    drain()  # first, added; then signoff parks
    WorkflowStep.objects.filter(run_id=wf.record.pk, status="waiting").delete()
    old = park_as_old_code(wf, "review", ["approved"])

    signal = wf.signal("approved", {"by": "manager"})
    drain()

    assert wf.reload().status == "finished"
    assert labels() == ["first", "added", "signoff:{'by': 'manager'}", "last"]
    signal.refresh_from_db()
    assert (signal.status, signal.consumed_by_id) == ("consumed", old.pk)
    old.refresh_from_db()
    assert (old.step_name, old.status) == ("review", "completed")


def test_a_run_parked_with_the_old_steps_names_is_woken_by_a_name_the_new_step_waits_for():
    wf = Evolving.start()
    drain()
    WorkflowStep.objects.filter(run_id=wf.record.pk, status="waiting").delete()
    park_as_old_code(wf, "review", ["reviewed"])  # the old step waited for another name

    with pytest.raises(UnknownSignal):
        wf.signal("reviewed")  # unknown to the new code (extra_signals would accept it)
    wf.signal("approved", "new name")
    drain()

    assert wf.reload().status == "finished"
    assert labels()[-2:] == ["signoff:new name", "last"]


def test_a_run_scheduled_on_the_old_name_is_claimed_and_runs_the_renamed_body():
    wf = Evolving.start()
    old = schedule_as_old_code(wf, "review")
    wf.signal("approved", {"n": 1})  # pending: the attempt has not parked yet

    [claimed] = claim_due_steps(10)
    assert claimed.pk == old.pk
    execute_step(claimed)
    drain()

    assert labels() == ["signoff:{'n': 1}", "last"]
    assert wf.reload().status == "finished"


class RenamedCharge(Workflow):
    """``capture`` was called ``charge``: its key must not change when a run on it is reattempted."""

    name = "deploy_renamed_charge"

    @step(renamed_from="charge", on_exception="reattempt")
    def capture(self):
        SideEffect.objects.create(label=f"key:{self.attempt}", key=self.step_idempotency_key)
        if self.attempt == 1:
            raise ConnectionError("the provider hung up")
        return {"charged_with": self.step_idempotency_key}

    @step
    def receipt(self):
        return {"receipt_for": self.outputs["capture"]["charged_with"]}  # by the name this code knows


def test_a_step_renamed_while_a_run_was_on_it_keeps_its_key_across_reattempts():
    wf = RenamedCharge.start()
    schedule_as_old_code(wf, "charge")  # scheduled by the code before the rename
    drain()

    assert wf.reload().status == "finished"
    names = list(WorkflowStep.objects.filter(run_id=wf.record.pk).order_by("pk").values_list("step_name", flat=True))
    assert names == ["charge", "capture", "receipt"]  # the reattempt is scheduled under the new name
    keys = dict(SideEffect.objects.values_list("label", "key"))
    assert keys == {"key:1": f"{wf.workflow_id}:charge", "key:2": f"{wf.workflow_id}:charge"}
    assert wf.outputs["receipt"] == {"receipt_for": f"{wf.workflow_id}:charge"}


class RenamedAsyncCharge(Workflow):
    """The same rename with an ``async def`` body: its key is read before the coroutine starts."""

    name = "deploy_renamed_async_charge"

    @step(renamed_from="charge")
    async def capture(self):
        return {"key": self.step_idempotency_key}


def test_an_async_body_renamed_while_a_run_was_on_it_reads_its_first_name_key_and_its_output_has_the_new_name():
    wf = RenamedAsyncCharge.start()
    schedule_as_old_code(wf, "charge")
    drain()

    assert wf.reload().status == "finished"
    assert wf.outputs["capture"] == {"key": f"{wf.workflow_id}:charge"}


def test_a_run_started_after_the_rename_keys_the_step_by_its_new_name():
    wf = RenamedCharge.start()
    drain()

    assert set(SideEffect.objects.values_list("key", flat=True)) == {f"{wf.workflow_id}:capture"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"renamed_from": "not a name"}, "renamed_from must be a step name"),
        ({"renamed_from": ["ok", 3]}, "renamed_from must be a step name"),
        ({"renamed_from": "other"}, "renamed_from='other' is already step 'other'"),
        ({"renamed_from": "gone"}, "renamed_from='gone' is already a gravestone"),
    ],
)
def test_renamed_from_is_checked_when_the_class_is_defined(options, message):
    with pytest.raises(ConfigurationError, match=message):

        class Bad(Workflow):
            name = "deploy_bad_rename"
            gone = removed_step()

            @step(**options)
            def new(self):
                pass

            @step
            def other(self):
                pass


# -- gravestones ------------------------------------------------------------------------------------------


def test_a_run_parked_on_a_step_that_became_a_gravestone_moves_on_and_keeps_its_one_approval():
    wf = Retiring.start()
    drain()
    park_as_old_code(wf, "manager_review", ["approved"], timeout=timedelta(hours=1))

    assert skip_parked_gravestones(timezone.now()) == 1

    wf.reload()
    assert (wf.status, wf.current_step) == ("ready", "manager_signoff")  # scheduled: it parks when claimed
    drain()
    assert wf.reload().status == "waiting"
    wf.signal("approved", "yes")
    drain()
    assert wf.reload().status == "finished"
    assert labels() == ["first", "signoff:yes"]
    assert not WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="wait_timed_out").exists()


def test_an_approval_that_wakes_a_gravestone_goes_back_to_pending_for_the_next_step():
    wf = Retiring.start()
    drain()
    gravestone = park_as_old_code(wf, "manager_review", ["approved"], timeout=timedelta(hours=1))

    signal = wf.signal("approved", "yes")  # wakes the gravestone attempt, which never runs a body
    drain()

    assert wf.reload().status == "finished"
    assert labels() == ["first", "signoff:yes"]
    gravestone.refresh_from_db()
    assert (gravestone.status, gravestone.signal_id) == ("skipped", None)
    signal.refresh_from_db()
    assert signal.status == "consumed" and signal.consumed_by.step_name == "manager_signoff"
    returned = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="signal_returned")
    assert returned.details == {"signal_id": signal.pk, "why": "skip"}


def test_a_gravestone_wait_that_times_out_moves_on_instead_of_pausing():
    wf = Retiring.start()
    drain()
    park_as_old_code(wf, "manager_review", ["approved"], timeout=timedelta(seconds=1))

    assert expire_due_waits(now=timezone.now() + timedelta(minutes=1)) == 1

    wf.reload()
    assert (wf.status, wf.current_step) == ("ready", "manager_signoff")
    assert not WorkflowStep.objects.filter(run_id=wf.record.pk, error_class__endswith="WaitTimedOut").exists()


# -- steps no live code defines --------------------------------------------------------------------------------


def test_a_step_no_code_defines_waits_then_the_sweep_pauses_its_run_after_the_grace():
    wf = Evolving.start()
    ghost = schedule_as_old_code(wf, "ghost")
    signal = wf.signal("approved")  # pending, for the step that will wait for it

    assert claim_due_steps(10) == []  # passed over, no attempt spent
    assert pause_unknown_steps(timezone.now()) == 0  # within UNKNOWN_STEP_GRACE: it waits
    later = timezone.now() + wf_settings.UNKNOWN_STEP_GRACE + timedelta(seconds=5)
    assert pause_unknown_steps(later) == 1

    wf.reload()
    assert wf.status == "paused"
    assert "StepNotDefined" in wf.record.paused_reason and "'ghost'" in wf.record.paused_reason
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="paused")
    assert event.details["error_class"] == "pgbus_workflows.exceptions.StepNotDefined"
    assert event.details["unknown"] == "step" and event.actor == "system"
    ghost.refresh_from_db()
    assert (ghost.status, ghost.held) == ("scheduled", True)  # unrun, out of the claims' way until resumed
    assert WorkflowSignal.objects.get(pk=signal.pk).status == "pending"


def test_a_run_of_a_class_no_code_has_is_paused_naming_the_class():
    run = WorkflowRun.objects.create(workflow_class="deploy_from_the_future", current_step="only")
    WorkflowStep.objects.create(run=run, step_name="only", queue="workflows")
    later = timezone.now() + wf_settings.UNKNOWN_STEP_GRACE + timedelta(seconds=5)

    assert claim_due_steps(10) == []
    assert pause_unknown_steps(later) == 1
    run.refresh_from_db()
    assert run.status == "paused" and "defines the class of step 'only'" in run.paused_reason


def test_a_live_dispatcher_whose_code_defines_the_step_keeps_the_sweep_from_pausing():
    wf = Evolving.start()
    schedule_as_old_code(wf, "ghost")
    later = timezone.now() + wf_settings.UNKNOWN_STEP_GRACE + timedelta(seconds=5)
    newer = {"deploy_evolving": ["first", "ghost", "last"]}
    Dispatcher.objects.create(name="newer", hostname="h", pid=1, catalog=newer, heartbeat_at=later)

    assert pause_unknown_steps(later) == 0
    assert wf.reload().status == "ready"

    Dispatcher.objects.filter(name="newer").update(heartbeat_at=later - timedelta(minutes=5))  # it died
    assert pause_unknown_steps(later) == 1
    assert wf.reload().status == "paused"


def test_the_test_helpers_still_pause_an_unknown_step_at_once_and_return_its_signal():
    wf = Evolving.start()
    ghost = schedule_as_old_code(wf, "ghost")
    signal = wf.signal("approved")
    WorkflowStep.objects.filter(pk=ghost.pk).update(signal=signal)
    WorkflowSignal.objects.filter(pk=signal.pk).update(status="consumed", consumed_by=ghost)

    execute_step(claim_step(ghost.pk))

    assert wf.reload().status == "paused"
    assert WorkflowSignal.objects.get(pk=signal.pk).status == "pending"


# -- signals consumed by an attempt whose body never ran --------------------------------------------------------


class SkippableWait(Workflow):
    name = "deploy_skippable_wait"

    @step(wait_for="go", skip_if="told_to_skip")
    def maybe(self):
        SideEffect.objects.create(label="maybe")

    @step(wait_for="go")
    def surely(self):
        SideEffect.objects.create(label=f"surely:{self.received_signal.payload}")

    def told_to_skip(self):
        return SideEffect.objects.filter(label="skip-now").exists()


def test_a_signal_that_woke_a_step_skip_if_skips_goes_to_the_next_step_waiting_for_it():
    wf = SkippableWait.start()
    drain()
    assert wf.reload().status == "waiting"
    SideEffect.objects.create(label="skip-now")

    wf.signal("go", 7)
    drain()

    assert wf.reload().status == "finished"
    assert labels() == ["skip-now", "surely:7"]


def test_a_signal_that_woke_a_step_an_operator_skips_goes_back_to_pending():
    wf = SkippableWait.start()
    drain()
    wf.pause(reason="hold on")
    wf.signal("go", 1)  # wakes the attempt (the run stays paused)
    wf.skip(actor="ops", reason="not this one")
    drain()

    assert wf.reload().status == "finished"
    assert labels() == ["surely:1"]


def test_a_signal_that_woke_a_step_goes_back_to_pending_when_an_operator_resumes_elsewhere():
    wf = SkippableWait.start()
    drain()
    wf.pause(reason="hold on")
    signal = wf.signal("go", 2)  # consumed by the waiting "maybe", which is now scheduled
    wf.resume_at("surely", actor="ops", reason="skip the first wait")
    drain()

    assert wf.reload().status == "finished"
    assert labels() == ["surely:2"]
    assert WorkflowSignal.objects.get(pk=signal.pk).consumed_by.step_name == "surely"


class CancellableWait(Workflow):
    name = "deploy_cancellable_wait"

    @step(wait_for="go")
    def only(self):
        SideEffect.objects.create(label="ran")

    def cancel_if(self):
        return SideEffect.objects.filter(label="cancel-now").exists()


def test_a_signal_that_woke_a_step_cancel_if_cancels_is_left_pending_not_consumed():
    wf = CancellableWait.start()
    drain()
    SideEffect.objects.create(label="cancel-now")
    signal = wf.signal("go")
    drain()

    assert wf.reload().status == "cancelled"
    signal.refresh_from_db()
    assert (signal.status, signal.consumed_by_id) == ("pending", None)
    assert labels() == ["cancel-now"]


# -- unknown signal names ----------------------------------------------------------------------------------


def test_a_typo_in_a_signal_name_raises_unknown_signal_and_writes_nothing(order):
    wf = Approval.start(order)
    with pytest.raises(UnknownSignal, match=r"waits for signal 'aproved' \(did you mean 'approved'\?\)") as raised:
        wf.signal("aproved")
    assert isinstance(raised.value, ValueError)
    with pytest.raises(UnknownSignal, match="Its steps wait for: approved"):
        Approval.signal_for(order, "aproved")
    order2 = type(order).objects.create()
    with pytest.raises(UnknownSignal):  # a typo is a typo even when no run is ongoing
        Approval.signal_for(order2, "aproved", missing="ignore")
    assert not WorkflowSignal.objects.exists()
    assert not WorkflowEvent.objects.filter(kind="signal_received").exists()
    with pytest.raises(NotOngoing):
        Approval.signal_for(order2, "approved")


def test_extra_signals_are_accepted_and_stay_pending():
    class Chatty(Workflow):
        name = "deploy_chatty"
        extra_signals = ["note"]

        @step
        def only(self):
            pass

    wf = Chatty.start()
    signal = wf.signal("note", {"text": "hi"})
    assert signal.status == "pending"
    assert Chatty.signal_names() == frozenset({"note"})


def test_a_run_of_a_class_this_code_lacks_accepts_any_signal_name():
    run = WorkflowRun.objects.create(workflow_class="deploy_from_the_future", current_step="only")
    signal = Workflow.find(run.workflow_id).signal("whatever")
    assert signal.status == "pending"


# -- mistakes caught when the class is defined ----------------------------------------------------------------


def test_a_skip_if_naming_no_method_is_refused_when_the_class_is_defined():
    with pytest.raises(ConfigurationError, match=r"first: skip_if='is_piad' names no method of the class"):

        class Typo(Workflow):
            name = "deploy_typo"

            @step(skip_if="is_piad")
            def first(self):
                pass

            def is_paid(self):
                return True


def test_a_skip_if_method_inherited_from_a_base_class_is_accepted():
    class Base(Workflow):
        abstract = True

        def is_paid(self):
            return True

    class Child(Base):
        name = "deploy_inherits_condition"

        @step(skip_if="is_paid")
        def first(self):
            pass

    assert Child.step_definition("first").skip_if == "is_paid"


def test_async_atomic_bodies_generators_and_conditions_are_refused_when_the_class_is_defined():
    with pytest.raises(ConfigurationError, match="is an async def with atomic=True: Django's async ORM runs no"):

        class AsyncStep(Workflow):
            name = "deploy_async_step"

            @step(atomic=True)
            async def first(self):
                pass

    with pytest.raises(ConfigurationError, match="is an async generator: a step body returns, it does not yield"):

        class AsyncGenerator(Workflow):
            name = "deploy_async_generator"

            @step
            async def first(self):
                yield 1

    with pytest.raises(ConfigurationError, match="skip_if must not be an async def"):

        class AsyncSkip(Workflow):
            name = "deploy_async_skip"

            @step(skip_if="later")
            def first(self):
                pass

            async def later(self):
                return True

    with pytest.raises(ConfigurationError, match="cancel_if must not be an async def"):

        class AsyncCancel(Workflow):
            name = "deploy_async_cancel"

            async def cancel_if(self):
                return False

            @step
            def first(self):
                pass


def test_a_class_without_a_name_gets_a_system_check_warning():
    class Nameless(Workflow):
        @step
        def first(self):
            pass

    try:
        warnings = {m.obj: m for m in run_checks(tags=[Tags.compatibility]) if m.id == "pgbus_workflows.W004"}
        assert "moving or renaming the module or the class orphans them" in warnings[Nameless].msg
        assert Approval not in warnings  # named
    finally:
        registry.unregister(Nameless.name)


def test_starting_a_class_defined_after_app_loading_warns_once(caplog):
    class LateComer(Workflow):
        name = "deploy_late_comer"

        @step
        def first(self):
            pass

    with caplog.at_level(logging.WARNING, logger="pgbus_workflows"):
        LateComer.start()
        LateComer.start()
    warned = [r.getMessage() for r in caplog.records if "deploy_late_comer" in r.getMessage()]
    assert len(warned) == 1 and "dispatchers, which import each app's workflows module, may not know it" in warned[0]
    assert not registry.registered_late(Counted.name)  # autodiscovered classes are known at boot


# -- settings parity with pgbus ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, timedelta(0), None])
def test_retention_zero_or_none_turns_the_cleanup_off(value):
    with override_settings(PGBUS_WORKFLOWS={"RETENTION": value}):
        assert wf_settings.RETENTION is None
        assert [m for m in run_checks(tags=[Tags.compatibility]) if m.id.startswith("pgbus_workflows.E")] == []
        wf = Counted.start()
        drain()
        WorkflowRun.objects.filter(pk=wf.record.pk).update(status_changed_at=timezone.now() - timedelta(days=3650))
        assert delete_expired_runs(timezone.now()) == 0
        assert WorkflowRun.objects.filter(pk=wf.record.pk).exists()


# -- manage.py check --database default ---------------------------------------------------------------------


def database_checks():
    return {m.id: m for m in run_checks(tags=[Tags.database], databases=["default"]) if m.id.startswith("pgbus")}


def test_the_database_check_reports_what_the_code_cannot_run_with_counts_and_what_to_do():
    assert database_checks() == {}

    for _ in range(2):
        run = WorkflowRun.objects.create(workflow_class="deploy_from_the_future", current_step="only")
        WorkflowStep.objects.create(run=run, step_name="only", queue="workflows")
    ghost = Evolving.start()
    schedule_as_old_code(ghost, "ghost")
    parked = Retiring.start()
    drain()
    park_as_old_code(parked, "manager_review", ["approved"])
    typo = Approval.start()
    WorkflowSignal.objects.create(run=typo.record, name="aproved", payload={}, received_at=timezone.now())
    Dispatcher.objects.create(name="billing-only", hostname="h", pid=1, queues=["billing"])

    found = database_checks()

    assert "2 ongoing run(s) of workflow class 'deploy_from_the_future'" in found["pgbus_workflows.W006"].msg
    assert "1 ongoing run(s) of deploy_evolving are on step 'ghost'" in found["pgbus_workflows.W007"].msg
    assert 'renamed_from="ghost"' in found["pgbus_workflows.W007"].hint
    assert "manager_review (1)" in found["pgbus_workflows.I001"].msg
    assert "1 pending signal(s) 'aproved' for runs of approval" in found["pgbus_workflows.W008"].msg
    assert "queue 'workflows', which no live dispatcher serves" in found["pgbus_workflows.W009"].msg
    assert "--queue workflows" in found["pgbus_workflows.W009"].hint

    Dispatcher.objects.create(name="all-queues", hostname="h", pid=2, queues=[])
    assert "pgbus_workflows.W009" not in database_checks()


# -- the admin's signal form ---------------------------------------------------------------------------------


def test_the_admin_signal_form_offers_the_names_the_step_waits_for_and_refuses_others(admin_client, order):
    wf = Approval.start(order)
    drain()
    assert wf.reload().status == "waiting"

    form = admin_client.get(operation_url(wf, "signal")).context["form"]
    assert form.fields["name"].choices == [("Waited for now", [("approved", "approved")])]
    assert form.fields["name"].initial == "approved"

    response = admin_client.post(operation_url(wf, "signal"), {"name": "aproved", "payload": "", "reason": "x"})
    assert response.status_code == 200
    assert "aproved is not one of the available choices" in " ".join(response.context["form"].errors["name"])
    assert not WorkflowSignal.objects.exists()

    quiet = Counted.start()  # its steps wait for no signal: no button to deliver one
    html = admin_client.get(run_page(quiet)).content.decode()
    assert f'href="{operation_url(quiet, "signal")}"' not in html
    assert f'href="{operation_url(quiet, "pause")}"' in html


class RetryingWait(Workflow):
    name = "deploy_retrying_wait"

    @step(wait_for="go")
    def gate(self):
        SideEffect.objects.create(label=f"gate:{self.attempt}")
        if self.attempt == 1:
            self.reattempt(wait=3600)

    @step
    def last(self):
        pass


def test_a_signal_whose_body_ran_stays_consumed_when_its_retry_is_skipped():
    wf = RetryingWait.start()
    drain()
    signal = wf.signal("go")
    drain()  # attempt 1 runs with the signal and reattempts; attempt 2 keeps the signal, due in an hour
    retry = WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled")
    assert (retry.attempt, retry.signal_id) == (2, signal.pk)

    wf.skip(actor="ops", reason="enough")

    signal.refresh_from_db()
    assert signal.status == "consumed" and signal.consumed_by.attempt == 1  # its body used it
    assert not WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="signal_returned").exists()
    drain()
    assert wf.reload().status == "finished"


def test_the_sweep_s_scan_for_unknown_steps_does_not_grow_with_the_registered_classes():
    # A condition per class once made this query's planning take seconds at 200 classes: the
    # known (class, step) pairs are matched in Python now, so no class is named in the SQL.
    assert len(registry.classes()) > 3
    with statements_sent() as sent:
        pause_unknown_steps(timezone.now())
    assert sent
    assert not [text for text in sent if '"workflow_class" = ' in text or '"workflow_class" IN' in text], sent
