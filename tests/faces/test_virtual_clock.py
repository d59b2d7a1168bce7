"""``advance()``: the test helpers' virtual clock lets waits, timeouts and ticks come due with no sleeping."""

from datetime import timedelta

from django.test import TestCase
from django.utils import timezone

from pgbus_workflows import OnException, Workflow, step
from pgbus_workflows.exceptions import StepWaiting
from pgbus_workflows.models import WorkflowEvent, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.sql import clock
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import labels, record
from tests.testapp.models import Order


class VirtualDrip(Workflow):
    name = "virtual_drip"

    @step
    def welcome(self):
        record("welcome")

    @step(wait=timedelta(days=2))
    def reminder(self):
        record("reminder")


class VirtualPayment(Workflow):
    name = "virtual_payment"

    @step(wait_for="paid", wait_timeout=timedelta(hours=1), on_timeout="run")
    def capture(self):
        record(f"capture timed_out={self.timed_out}")


class VirtualFlaky(Workflow):
    name = "virtual_flaky"
    exception_policies = [OnException(ConnectionError, action="reattempt", wait=timedelta(minutes=10))]

    @step
    def call(self):
        record(f"call {self.attempt}")
        if self.attempt == 1:
            raise ConnectionError("the service is down")


class VirtualReport(Workflow):
    name = "virtual_report"
    allow_missing_subject = True
    allow_multiple = True

    @step
    def build(self):
        record(f"build {self.scheduled_for:%H:%M}")


def claimable(wf) -> list[str]:
    """What the dispatcher's own claim takes of ``wf`` now (the claim compares deadlines with the clock)."""
    return [s.step_name for s in claim_due_steps(10) if s.run_id == wf.record.pk]


class AdvanceTests(WorkflowTestMixin, TestCase):
    def setUp(self):
        self.order = Order.objects.create()

    def test_a_wait_is_due_once_its_time_has_passed_and_runs_without_run_now(self):
        wf = self.perform_next_step(VirtualDrip.start(self.order))
        self.advance(timedelta(days=1))
        self.assertEqual(claimable(wf), [])  # a day left: not due for the dispatcher either
        self.advance(timedelta(days=1, seconds=1))
        self.assertEqual(claimable(wf), ["reminder"])
        self.assertFalse(WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="run_now").exists())

    def test_the_next_step_helper_runs_a_wait_that_came_due_as_it_is(self):
        wf = self.perform_next_step(VirtualDrip.start(self.order))
        self.advance(2 * 24 * 3600 + 1)  # seconds, as durations are elsewhere
        self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")
        self.assertEqual(labels(), ["welcome", "reminder"])
        self.assertFalse(WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="run_now").exists())

    def test_a_signal_wait_times_out_when_its_deadline_passes_and_not_before(self):
        wf = VirtualPayment.start(self.order)
        with self.assertRaises(StepWaiting):
            self.speedrun_workflow(wf)
        self.assertEqual(wf.reload().status, "waiting")
        self.advance(timedelta(minutes=59))
        self.assertEqual(wf.reload().status, "waiting")
        self.advance(timedelta(minutes=2))
        self.assertEqual(wf.reload().status, "ready")
        self.speedrun_workflow(wf)
        self.assertEqual(labels(), ["capture timed_out=True"])
        self.assertWorkflowStatus(wf, "finished")

    def test_a_backoff_is_due_once_it_has_passed(self):
        wf = self.perform_next_step(VirtualFlaky.start(self.order))
        [reattempt] = WorkflowStep.objects.filter(run_id=wf.record.pk, status="scheduled")
        self.assertEqual(reattempt.attempt, 2)
        self.assertEqual(claimable(wf), [])
        self.advance(timedelta(minutes=10, seconds=1))
        self.assertEqual(claimable(wf), ["call"])

    def test_the_schedule_ticks_within_the_time_that_passed_fire_one_run_each(self):
        schedule = VirtualReport.add_schedule(every=timedelta(hours=1), catchup="all", overlap="allow", name="hourly")
        first = schedule.next_fire_at
        before = first - clock.now()  # under 5 s when the test runs just before a whole hour
        self.assertEqual(self.advance(before - min(timedelta(seconds=5), before / 2)), [])
        started = self.advance(timedelta(hours=1, seconds=10))
        self.assertEqual(sorted(wf.record.scheduled_for for wf in started), [first, first + timedelta(hours=1)])
        self.assertEqual(labels(), [])  # the ticks start runs; their steps are not run

    def test_bad_durations_are_refused_and_move_nothing(self):
        for duration, error in [("1h", TypeError), (True, TypeError), (0, ValueError), (-5, ValueError)]:
            with self.subTest(duration=duration), self.assertRaises(error):
                self.advance(duration)
        for duration in (float("nan"), float("inf"), 10**20):
            with self.subTest(duration=duration), self.assertRaises(ValueError):
                self.advance(duration)
        self.assertEqual(clock.skipped(), timedelta(0))


class TheClockGoesBackTests(WorkflowTestMixin, TestCase):
    def test_the_time_that_passed_is_undone_when_the_test_ends(self):
        self.advance(timedelta(days=30))
        self.advance(timedelta(days=1))
        self.assertEqual(clock.skipped(), timedelta(days=31))
        self.doCleanups()  # what unittest runs as the test ends
        self.assertEqual(clock.skipped(), timedelta(0))
        self.assertLess(abs(clock.now() - timezone.now()), timedelta(minutes=1))


class AsyncAdvanceTests(WorkflowTestMixin, TestCase):
    async def test_aadvance_lets_the_wait_come_due_from_an_async_test(self):
        order = await Order.objects.acreate()
        wf = await self.aperform_next_step(await VirtualDrip.astart(order))
        await self.aadvance(timedelta(days=2, seconds=1))
        await self.aspeedrun_workflow(wf)
        self.assertEqual(await Order.objects.acount(), 1)
        self.assertEqual((await wf.afind(wf.workflow_id)).status, "finished")
