"""``bench.scale``'s rows written in SQL are the rows the engine writes: copies of runs it made."""

from __future__ import annotations

from datetime import timedelta

from django.test import TestCase

from bench.scale_fill import Copies, check_copies, copy_run
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.sql import clock
from pgbus_workflows.testing import WorkflowTestMixin
from tests.testapp.workflows import Approval, ThreeSteps, Waits


class CopiesOfFinishedRuns(WorkflowTestMixin, TestCase):
    def test_each_copy_has_the_templates_attempts_and_events_with_its_time_spread(self) -> None:
        template = self.speedrun_workflow(ThreeSteps.start()).record
        copy_run(Copies(template.pk, 4, "copied", spread_seconds=4 * 3600))

        copies = WorkflowRun.objects.filter(workflow_class="copied").order_by("pk")
        self.assertEqual(copies.count(), 4)
        check_copies(template.pk, "copied")
        for copy in copies:
            self.assertEqual(WorkflowStep.objects.filter(run=copy).count(), 3)
            self.assertEqual(
                WorkflowEvent.objects.filter(run=copy).count(), WorkflowEvent.objects.filter(run=template).count()
            )
            self.assertNotEqual(copy.workflow_id, template.workflow_id)
        ends = [copy.finished_at for copy in copies]
        self.assertEqual(ends, sorted(ends, reverse=True), "copy g ends spread * g / count before now")
        now = clock.now()
        self.assertLess(now - ends[-1], timedelta(hours=4, minutes=1))
        self.assertGreater(now - ends[-1], timedelta(hours=3, minutes=59))

    def test_a_template_with_signals_is_refused(self) -> None:
        run = Approval.start()
        self.deliver_signal(run, "approved", {"ok": True})
        with self.assertRaisesMessage(ValueError, "a template must have neither"):
            copy_run(Copies(run.record.pk, 2, "copied", spread_seconds=60))


class CopiesOfWaitingRuns(WorkflowTestMixin, TestCase):
    def test_a_copy_waits_days_then_the_engine_runs_it_to_its_end(self) -> None:
        template = Waits.start()
        self.perform_next_step(template)
        copy_run(Copies(template.record.pk, 3, Waits.name, spread_seconds=3600, due_in_seconds=3 * 86400))

        check_copies(template.record.pk, Waits.name)
        copy = Waits.find(WorkflowRun.objects.filter(workflow_class=Waits.name).order_by("-pk")[0].workflow_id)
        due = WorkflowStep.objects.get(run=copy.record, status="scheduled").scheduled_at
        self.assertGreater(due - clock.now(), timedelta(days=3))
        self.advance(timedelta(days=3, hours=1))
        self.speedrun_workflow(copy)
        self.assertWorkflowStatus(copy, "finished")
