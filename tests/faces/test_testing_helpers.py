"""WorkflowTestMixin used the way a user would: mixed into a django.test.TestCase."""

from datetime import timedelta

from django.test import TestCase
from django.utils import timezone

from pgbus_workflows import Workflow, step
from pgbus_workflows.exceptions import TestHelperError
from pgbus_workflows.models import WorkflowEvent, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import labels, record
from tests.testapp.durable_workflows import durable_noop3
from tests.testapp.models import Order


class HelpersDrip(Workflow):
    name = "helpers_drip"

    @step
    def welcome(self):
        record("welcome")
        return {"hello": self.subject.pk}

    @step(wait=timedelta(days=2))
    def reminder(self):
        record("reminder")

    @step
    def goodbye(self):
        record("goodbye")


class HelpersPauses(Workflow):
    name = "helpers_pauses"

    @step
    def check(self):
        record("check")
        self.pause("needs a human")

    @step
    def after(self):
        record("after")


class HelpersCancels(Workflow):
    name = "helpers_cancels"

    @step
    def check(self):
        record("check")
        self.cancel("not wanted")

    @step
    def after(self):
        record("after")


class HelpersForever(Workflow):
    name = "helpers_forever"

    @step
    def poll(self):
        record("poll")
        self.reattempt()


def names_and_statuses(wf) -> list[tuple[str, str]]:
    """The (step name, status) of the run's attempts, oldest first."""
    return list(WorkflowStep.objects.filter(run_id=wf.record.pk).order_by("pk").values_list("step_name", "status"))


class PerformNextStepTests(WorkflowTestMixin, TestCase):
    def setUp(self):
        self.order = Order.objects.create()

    def test_runs_the_scheduled_step_and_returns_the_reloaded_handle(self):
        wf = HelpersDrip.start(self.order)

        returned = self.perform_next_step(wf)

        self.assertIs(returned, wf)
        self.assertEqual(wf.status, "ready")
        self.assertEqual(wf.current_step, "reminder")
        self.assertEqual(labels(), ["welcome"])
        self.assertEqual(wf.outputs, {"welcome": {"hello": self.order.pk}})
        self.assertFalse(wf.events.filter(kind="run_now").exists())

    def test_ignores_wait_and_records_run_now_by_test_helpers(self):
        wf = HelpersDrip.start(self.order)
        self.perform_next_step(wf)
        reminder = WorkflowStep.objects.get(run_id=wf.record.pk, step_name="reminder")
        self.assertGreater(reminder.scheduled_at, timezone.now() + timedelta(days=1))

        self.perform_next_step(wf)

        self.assertEqual(labels(), ["welcome", "reminder"])
        self.assertEqual(wf.current_step, "goodbye")
        run_now = wf.events.get(kind="run_now")
        self.assertEqual(run_now.actor, "test_helpers")
        self.assertEqual(run_now.reason, "run inline by a test helper")
        self.assertEqual(run_now.step_id, reminder.pk)
        self.assertEqual(run_now.details, {"was_scheduled_at": reminder.scheduled_at.isoformat()})
        reminder.refresh_from_db()
        self.assertEqual(reminder.status, "completed")

    def test_on_a_paused_run_says_resume_it_first(self):
        wf = HelpersDrip.start(self.order)
        wf.pause(actor="alice")
        events = WorkflowEvent.objects.count()

        with self.assertRaisesMessage(TestHelperError, f"{wf!r} is paused, not ready: resume() it first"):
            self.perform_next_step(wf)

        self.assertEqual(labels(), [])
        self.assertEqual(names_and_statuses(wf), [("welcome", "scheduled")])
        self.assertEqual(WorkflowEvent.objects.count(), events)

    def test_on_a_finished_run_says_rerun_starts_a_new_run(self):
        wf = self.speedrun_workflow(HelpersDrip.start(self.order))

        with self.assertRaisesMessage(TestHelperError, "is finished, not ready: it is over; rerun() starts a new run"):
            self.perform_next_step(wf)

        self.assertEqual(labels(), ["welcome", "reminder", "goodbye"])

    def test_on_a_cancelled_run_says_rerun_starts_a_new_run(self):
        wf = HelpersDrip.start(self.order)
        wf.cancel(actor="bob")

        with self.assertRaisesMessage(TestHelperError, "is cancelled, not ready: it is over; rerun() starts a new run"):
            self.perform_next_step(wf)

        self.assertEqual(labels(), [])

    def test_on_a_performing_run_says_a_step_is_still_running(self):
        wf = HelpersDrip.start(self.order)
        (claimed,) = claim_due_steps(1)

        with self.assertRaisesMessage(TestHelperError, "is performing, not ready: a step is still running"):
            self.perform_next_step(wf)

        claimed.refresh_from_db()
        self.assertEqual(claimed.status, "in_progress")
        self.assertEqual(labels(), [])


class RunStepInlineTests(WorkflowTestMixin, TestCase):
    def setUp(self):
        self.order = Order.objects.create()

    def test_runs_the_named_step_when_it_is_next(self):
        wf = HelpersDrip.start(self.order)
        self.run_step_inline(wf, "welcome")
        returned = self.run_step_inline(wf, "reminder")

        self.assertIs(returned, wf)
        self.assertEqual(labels(), ["welcome", "reminder"])
        self.assertEqual(wf.current_step, "goodbye")

    def test_raises_when_another_step_is_next_and_runs_nothing(self):
        wf = HelpersDrip.start(self.order)
        events = WorkflowEvent.objects.count()

        with self.assertRaisesMessage(TestHelperError, f"{wf!r} is not about to run reminder (scheduled: welcome)"):
            self.run_step_inline(wf, "reminder")

        self.assertEqual(labels(), [])
        self.assertEqual(names_and_statuses(wf), [("welcome", "scheduled")])
        self.assertEqual(WorkflowEvent.objects.count(), events)

    def test_raises_on_a_paused_run(self):
        wf = HelpersDrip.start(self.order)
        wf.pause()
        with self.assertRaisesMessage(TestHelperError, "resume() it first"):
            self.run_step_inline(wf, "welcome")
        self.assertEqual(labels(), [])


class SpeedrunTests(WorkflowTestMixin, TestCase):
    def setUp(self):
        self.order = Order.objects.create()

    def test_runs_to_finished_ignoring_waits(self):
        wf = HelpersDrip.start(self.order)

        returned = self.speedrun_workflow(wf)

        self.assertIs(returned, wf)
        self.assertWorkflowStatus(wf, "finished")
        self.assertStepsCompleted(wf, ["welcome", "reminder", "goodbye"])
        self.assertEqual(labels(), ["welcome", "reminder", "goodbye"])
        self.assertEqual(wf.events.filter(kind="run_now", actor="test_helpers").count(), 1)

    def test_stops_at_paused(self):
        wf = HelpersPauses.start(self.order)

        self.speedrun_workflow(wf)

        self.assertWorkflowStatus(wf, "paused")
        self.assertEqual(wf.record.paused_reason, "needs a human")
        self.assertEqual(labels(), ["check"])
        self.assertEqual(names_and_statuses(wf), [("check", "cancelled")])

    def test_stops_at_cancelled(self):
        wf = HelpersCancels.start(self.order)

        self.speedrun_workflow(wf)

        self.assertWorkflowStatus(wf, "cancelled")
        self.assertEqual(labels(), ["check"])
        self.assertEqual(names_and_statuses(wf), [("check", "cancelled")])

    def test_raises_after_max_steps_on_an_endless_reattempt_loop(self):
        wf = HelpersForever.start(self.order)

        with self.assertRaisesMessage(TestHelperError, f"{wf!r} was still ready after 5 steps"):
            self.speedrun_workflow(wf, max_steps=5)

        self.assertEqual(labels(), ["poll"] * 5)
        attempts = list(
            WorkflowStep.objects.filter(run_id=wf.record.pk).order_by("pk").values_list("attempt", "status", "outcome")
        )
        self.assertEqual(attempts, [(n, "completed", "reattempted") for n in range(1, 6)] + [(6, "scheduled", "")])

    def test_on_a_finished_run_returns_it_untouched(self):
        wf = self.speedrun_workflow(HelpersDrip.start(self.order))
        events = wf.events.count()

        self.speedrun_workflow(wf)

        self.assertWorkflowStatus(wf, "finished")
        self.assertEqual(wf.events.count(), events)


class AssertionTests(WorkflowTestMixin, TestCase):
    def setUp(self):
        self.order = Order.objects.create()

    def test_assert_workflow_status_passes_and_fails_with_its_message(self):
        wf = HelpersDrip.start(self.order)
        self.assertWorkflowStatus(wf, "ready")

        with self.assertRaisesMessage(AssertionError, "Expected workflow to be finished, but was ready"):
            self.assertWorkflowStatus(wf, "finished")

    def test_assert_workflow_status_reloads_the_run(self):
        wf = HelpersDrip.start(self.order)
        HelpersDrip.find(wf.workflow_id).cancel(actor="bob")  # another handle on the same run
        self.assertEqual(wf.status, "ready")

        self.assertWorkflowStatus(wf, "cancelled")

    def test_assert_steps_completed_passes_and_fails_with_its_message(self):
        wf = HelpersDrip.start(self.order)
        self.perform_next_step(wf)
        self.assertStepsCompleted(wf, ["welcome"])

        with self.assertRaisesMessage(
            AssertionError, "Expected steps ['welcome', 'reminder'] to be completed, but completed were ['welcome']"
        ):
            self.assertStepsCompleted(wf, ["welcome", "reminder"])
        with self.assertRaisesMessage(AssertionError, "but completed were ['welcome']"):
            self.assertStepsCompleted(wf, [])

    def test_assert_steps_completed_leaves_out_reattempted_and_skipped_steps(self):
        wf = HelpersForever.start(self.order)
        with self.assertRaises(TestHelperError):
            self.speedrun_workflow(wf, max_steps=2)
        self.assertStepsCompleted(wf, [])

        drip = HelpersDrip.start(Order.objects.create())
        drip.skip(actor="erin")
        self.speedrun_workflow(drip)
        self.assertStepsCompleted(drip, ["reminder", "goodbye"])

    def test_a_step_that_comes_due_while_the_helper_moves_it_up_runs(self):
        """Due a moment after the helper reads the clock, before ``run_now`` does: it runs, no refusal."""
        for delay in range(40):  # one of these lands between the helper's read and run_now's (a few ms)
            wf = HelpersDrip.start(Order.objects.create())
            WorkflowStep.objects.filter(run_id=wf.record.pk).update(
                scheduled_at=timezone.now() + timedelta(microseconds=250 * delay)
            )
            self.perform_next_step(wf)
            self.assertStepsCompleted(wf, ["welcome"])

    def test_assert_steps_completed_on_a_durable_run_lists_its_checkpoints(self):
        """The function's own ``@function`` row, which holds its result, is not a checkpoint."""
        wf = durable_noop3.start(None)
        self.speedrun_workflow(wf)
        self.assertTrue(WorkflowStep.objects.filter(run_id=wf.record.pk, step_name="@function").exists())
        self.assertStepsCompleted(wf, ["a", "b", "c"])
