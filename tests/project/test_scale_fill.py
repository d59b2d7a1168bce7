"""``bench.scale``'s rows written in SQL are the rows the engine writes: copies of runs it made."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.test import TestCase

from bench.scale_fill import Copies, bulk_load, check_copies, copy_run
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


TABLES = (WorkflowRun, WorkflowStep, WorkflowEvent)


def indexes_and_triggers() -> tuple[set[str], set[tuple[str, str]]]:
    """The three tables' index definitions, and (trigger, enabled) of each of their triggers."""
    names = [model._meta.db_table for model in TABLES]
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = ANY(%s)", [names])
        indexes = {row[0] for row in cursor.fetchall()}
        cursor.execute("SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = ANY(%s::regclass[])", [names])
        return indexes, set(cursor.fetchall())


class CopiesLoadedInBulk(WorkflowTestMixin, TestCase):
    def test_the_tables_fill_without_their_indexes_and_triggers_and_get_them_back(self) -> None:
        before_indexes, before_triggers = indexes_and_triggers()
        template = self.speedrun_workflow(ThreeSteps.start()).record
        with bulk_load(TABLES):
            during_indexes, during_triggers = indexes_and_triggers()
            copy_run(Copies(template.pk, 3, "copied", spread_seconds=60))

        self.assertLess(len(during_indexes), len(before_indexes) - 20)
        self.assertTrue(any("_pkey" in index for index in during_indexes), "primary keys stay")
        self.assertEqual({enabled for _, enabled in during_triggers}, {"D"})
        after_indexes, after_triggers = indexes_and_triggers()
        self.assertEqual(after_indexes ^ before_indexes, set())
        self.assertEqual(after_triggers, before_triggers)
        self.assertEqual({enabled for _, enabled in before_triggers}, {"O"})
        check_copies(template.pk, "copied")
        self.assertEqual(WorkflowRun.objects.filter(workflow_class="copied").count(), 3)
