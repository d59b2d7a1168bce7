"""Child workflows: a ``@fan_out`` body returns ``Child`` items; the step resolves when every child ended.

Inline tests (``WorkflowTestMixin``, the real executor) assert on the rows; the tests that need
commits (the automatic resolution, ``result()`` from another thread) use a transactional database.
"""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import TestCase, override_settings
from django.utils import timezone

from pgbus_workflows import (
    Child,
    ChildDepthExceeded,
    FanOutFailed,
    Job,
    Workflow,
    WorkflowCancelled,
    fan_out,
    step,
)
from pgbus_workflows.conf import settings as wf_settings
from pgbus_workflows.exceptions import ConfigurationError, StepWaiting
from pgbus_workflows.models import FanOutJob, WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services import results
from pgbus_workflows.services.fanout_recovery import resolve_lost_fan_outs
from pgbus_workflows.testing import WorkflowTestMixin
from tests.procs import eventually
from tests.support import events_of, run_next, statements_sent
from tests.testapp.child_workflows import (
    Abandoned,
    Forever,
    Many,
    Shipment,
    ShipOrder,
    ShipWhatever,
    SlowChild,
    Tree,
    Waiter,
)
from tests.testapp.jobs import noop
from tests.testapp.models import Order, SideEffect
from tests.threads import Worker

pytestmark = pytest.mark.django_db


class OnePerOrder(Workflow):
    """A child class with at most one ongoing run per subject (no ``allow_multiple``)."""

    name = "children_one_per_order"

    @step
    def work(self):
        return {"order": self.subject.pk}


class Twice(Workflow):
    """Two children about the same order: the second one's start is refused (AlreadyRunning)."""

    name = "children_twice"

    @fan_out
    def both(self):
        order = Order.objects.get(pk=self.arguments["order"])
        return [Child(OnePerOrder, order), Child(OnePerOrder, order)]


class Keyed(Workflow):
    """A child with a key of the caller's: ``key``."""

    name = "children_keyed"
    allow_multiple = True

    @fan_out
    def spawn(self):
        return [Child(Waiter, idempotency_key=self.arguments["key"], n=0)]


class Stepless(Workflow):
    """A child class with no steps: its run finishes as it starts."""

    name = "children_stepless"
    allow_multiple = True


class OfStepless(Workflow):
    """A parent of two Stepless children."""

    name = "children_of_stepless"

    @fan_out
    def spawn(self):
        return [Child(Stepless, n=0), Child(Stepless, n=1)]


class Mixed(Workflow):
    """A fan-out that returns a Job and a Child: refused."""

    name = "children_mixed"

    @fan_out
    def both(self):
        return [Job(noop), Child(Waiter)]


def shipments_of(wf: Workflow) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent_id=wf.record.pk).order_by("id"))


class StartingChildren(WorkflowTestMixin, TestCase):
    def setUp(self):
        self.orders = [Order.objects.create() for _ in range(3)]

    def start(self, cls=ShipOrder, **arguments):
        arguments.setdefault("orders", [o.pk for o in self.orders])
        return cls.start(**arguments)

    def test_the_park_starts_one_child_per_item_with_its_lineage(self):
        wf = self.perform_next_step(self.start())
        self.assertEqual(wf.status, "waiting")
        children = shipments_of(wf)
        self.assertEqual([c.subject_id for c in children], [str(o.pk) for o in self.orders])
        parked = WorkflowStep.objects.get(run_id=wf.record.pk, step_name="shipments")
        jobs = list(FanOutJob.objects.filter(step=parked).order_by("index"))
        self.assertEqual(parked.fan_out_total, 3)
        self.assertEqual([j.status for j in jobs], ["running"] * 3)
        self.assertEqual([j.function for j in jobs], ["child:shipment"] * 3)
        for child, job in zip(children, jobs, strict=True):
            self.assertEqual((child.parent_job_id, child.parent_close, child.depth), (job.pk, "cancel", 1))
            self.assertEqual(child.status, "ready")
            self.assertEqual(child.arguments, {"carrier": "dhl", "cancel": False})
            self.assertEqual(child.idempotency_key, f"child:{wf.workflow_id}:shipments:{job.index}")
        started = WorkflowEvent.objects.get(run_id=children[0].pk, kind="started")
        self.assertEqual((started.actor, started.details["parent"]), (f"parent:{wf.workflow_id}", str(wf.workflow_id)))
        self.assertEqual(events_of(wf, "fan_out_started")[0].details, {"children": 3, "ended": 0})
        self.assertEqual([c.workflow_id for c in wf.children], [c.workflow_id for c in children])
        self.assertEqual(wf.children[0].parent.workflow_id, wf.workflow_id)
        self.assertIsNone(wf.parent)

    def test_complete_fan_out_runs_the_children_and_the_parent_reads_their_results(self):
        wf = self.perform_next_step(self.start())
        self.complete_fan_out(wf)
        self.assertWorkflowStatus(wf, "ready")
        self.speedrun_workflow(wf)
        self.assertWorkflowStatus(wf, "finished")
        tracking = [f"dhl-{o.pk}" for o in self.orders]
        self.assertEqual(wf.result(), {"tracking": tracking})
        self.assertEqual([c.status for c in shipments_of(wf)], ["finished"] * 3)
        self.assertEqual(Shipment.find(shipments_of(wf)[0].workflow_id).result(), {"tracking": tracking[0]})
        # The body's own output is the step's; its counts are in the step_completed event.
        self.assertEqual(wf.outputs["shipments"], {"parcels": 3})
        completed = [e for e in events_of(wf, "step_completed") if e.step.step_name == "shipments"]
        self.assertEqual(completed[0].details["fan_out"], {"total": 3, "succeeded": 3, "failed": 0})

    def test_speedrun_names_the_children_a_parent_waits_for(self):
        wf = self.perform_next_step(self.start())
        with self.assertRaises(StepWaiting) as caught:
            self.speedrun_workflow(wf)
        message = str(caught.exception)
        self.assertIn("waiting on step shipments's 3 children, 3 ongoing", message)
        self.assertIn(str(shipments_of(wf)[0].workflow_id), message)
        self.assertIn("complete_fan_out", message)

    def test_a_cancelled_child_fails_the_step_and_the_policy_pauses_the_parent(self):
        wf = self.perform_next_step(self.start(cancel=[self.orders[1].pk]))
        self.complete_fan_out(wf)
        self.assertWorkflowStatus(wf, "paused")
        failed = WorkflowStep.objects.filter(run_id=wf.record.pk, step_name="shipments").latest("pk")
        self.assertEqual(failed.error_class, f"{FanOutFailed.__module__}.FanOutFailed")
        self.assertIn("1 of 3 children of shipments failed", failed.error_message)
        job = FanOutJob.objects.get(step_id=failed.pk, index=1)
        self.assertEqual(job.status, "failed")
        self.assertIn("was cancelled: no such address", job.error)

    def test_on_job_failure_continue_gives_none_for_a_cancelled_child(self):
        wf = self.perform_next_step(self.start(ShipWhatever, cancel=[self.orders[0].pk]))
        self.complete_fan_out(wf)
        self.speedrun_workflow(wf)
        self.assertEqual(wf.result(), {"tracking": [None, f"ups-{self.orders[1].pk}", f"ups-{self.orders[2].pk}"]})

    def test_a_reattempt_of_the_step_reattaches_the_children_it_started(self):
        wf = self.perform_next_step(self.start(cancel=[self.orders[2].pk]))
        self.complete_fan_out(wf)
        self.assertWorkflowStatus(wf, "paused")
        before = {c.pk for c in shipments_of(wf)}
        wf.resume_at("shipments")
        self.perform_next_step(wf)
        self.assertEqual({c.pk for c in shipments_of(wf)}, before)  # no second child
        self.assertEqual(len(events_of(wf, "child_reattached")), 3)
        # Every child had ended: the re-attached step resolves at once, failing again on the cancelled one.
        self.complete_fan_out(wf)
        self.assertWorkflowStatus(wf, "paused")
        self.assertEqual(WorkflowRun.objects.filter(workflow_class="shipment").count(), 3)

    def test_an_ongoing_reattached_child_is_waited_for_again(self):
        wf = self.perform_next_step(Abandoned.start(count=2))
        wf.pause()
        wf.resume_at("spawn")  # the fan-out is abandoned (its children cancelled), then runs again
        self.assertEqual([c.status for c in shipments_of(wf)], ["cancelled", "cancelled"])
        self.perform_next_step(wf)
        self.assertEqual(len(shipments_of(wf)), 2)

    def test_a_body_returning_jobs_and_children_is_an_error(self):
        wf = self.perform_next_step(Mixed.start())
        self.assertWorkflowStatus(wf, "paused")
        failed = WorkflowStep.objects.get(run_id=wf.record.pk)
        self.assertIn("both Job and Child items", failed.error_message)
        self.assertFalse(WorkflowRun.objects.exclude(pk=wf.record.pk).exists())

    def test_child_refuses_a_non_workflow_and_an_unknown_policy(self):
        with self.assertRaisesMessage(ConfigurationError, "takes a Workflow subclass"):
            Child(noop)
        with self.assertRaisesMessage(ConfigurationError, "parent_close must be one of cancel, abandon"):
            Child(Waiter, parent_close="orphan")

    @override_settings(PGBUS_WORKFLOWS={"MAX_CHILD_DEPTH": 3})
    def test_max_child_depth_stops_a_workflow_that_starts_itself(self):
        wf = Forever.start()
        runs = [wf]
        for depth in range(3):
            self.perform_next_step(runs[-1])
            runs.append(runs[-1].children[0])
            self.assertEqual(runs[-1].record.depth, depth + 1)
        deepest = self.perform_next_step(runs[-1])
        self.assertWorkflowStatus(deepest, "paused")
        failed = WorkflowStep.objects.get(run_id=deepest.record.pk)
        self.assertEqual(failed.error_class, f"{ChildDepthExceeded.__module__}.ChildDepthExceeded")
        self.assertIn("MAX_CHILD_DEPTH (3)", failed.error_message)
        self.assertEqual(deepest.children, [])

    def test_a_refused_child_start_fails_the_step_and_starts_nothing(self):
        wf = self.perform_next_step(Twice.start(order=Order.objects.create().pk))
        self.assertWorkflowStatus(wf, "paused")
        failed = WorkflowStep.objects.get(run_id=wf.record.pk)
        self.assertEqual(failed.error_class, "pgbus_workflows.exceptions.AlreadyRunning")
        self.assertFalse(WorkflowRun.objects.filter(workflow_class="children_one_per_order").exists())
        self.assertFalse(FanOutJob.objects.exists())

    def test_the_children_of_one_class_are_inserted_with_one_statement_per_table(self):
        wf = Many.start(count=10)
        with statements_sent() as sent:
            self.perform_next_step(wf)
        self.assertEqual(len(wf.children), 10)
        run_inserts = [t for t in sent if t.startswith('INSERT INTO "pgbus_workflows_workflowrun"')]
        job_inserts = [t for t in sent if t.startswith('INSERT INTO "pgbus_workflows_fanoutjob"')]
        self.assertEqual((len(run_inserts), len(job_inserts)), (1, 1))

    def test_a_key_of_a_run_that_is_not_a_child_of_this_step_raises_child_conflict(self):
        Waiter.start(idempotency_key="taken", n=0)
        wf = self.perform_next_step(Keyed.start(key="taken"))
        self.assertWorkflowStatus(wf, "paused")
        failed = WorkflowStep.objects.get(run_id=wf.record.pk)
        self.assertEqual(failed.error_class, "pgbus_workflows.exceptions.ChildConflict")
        self.assertIn("is not a child of", failed.error_message)

    def test_the_sweep_resolves_a_parent_whose_wake_up_was_lost(self):
        # A TestCase never commits, so the after-commit resolution never runs: as if it were lost.
        wf = self.perform_next_step(Many.start(count=2))
        for child in wf.children:
            self.speedrun_workflow(child)
        self.assertWorkflowStatus(wf, "waiting")
        later = timezone.now() + wf_settings.STALL_THRESHOLD + timedelta(seconds=1)
        self.assertEqual(resolve_lost_fan_outs(later), 1)
        self.assertWorkflowStatus(wf, "ready")

    def test_children_of_a_class_without_steps_finish_as_they_start(self):
        wf = self.perform_next_step(OfStepless.start())
        self.assertEqual([c.status for c in wf.children], ["finished", "finished"])
        self.assertEqual(events_of(wf, "fan_out_started")[0].details, {"children": 2, "ended": 2})
        self.assertEqual(set(FanOutJob.objects.values_list("status", flat=True)), {"succeeded"})
        self.complete_fan_out(wf)
        self.assertWorkflowStatus(wf, "finished")

    def test_max_child_depth_defaults_to_ten(self):
        self.assertEqual(wf_settings.MAX_CHILD_DEPTH, 10)


class ParentClose(WorkflowTestMixin, TestCase):
    def test_cancelling_a_parent_cancels_its_ongoing_children_unless_abandoned(self):
        wf = self.perform_next_step(Abandoned.start(count=3, abandon=1))
        wf.cancel("not needed", actor="ops")
        statuses = [c.status for c in shipments_of(wf)]
        self.assertEqual(statuses, ["ready", "cancelled", "cancelled"])
        cancelled = WorkflowEvent.objects.get(run_id=shipments_of(wf)[1].pk, kind="cancelled")
        self.assertEqual(cancelled.actor, f"parent:{wf.workflow_id}")
        self.assertEqual(cancelled.reason, "its parent was cancelled: not needed")

    def test_grandchildren_are_cancelled_with_their_grandparent(self):
        root = self.perform_next_step(Tree.start(depth=2, width=2))
        for child in root.children:
            self.perform_next_step(child)
            for grandchild in child.children:
                self.perform_next_step(grandchild)
                for leaf in grandchild.children:
                    self.perform_next_step(leaf)
        leaves = WorkflowRun.objects.filter(workflow_class="child_waiter")
        self.assertEqual(leaves.count(), 4)
        self.assertEqual(set(leaves.values_list("status", flat=True)), {"waiting"})
        root.cancel()
        everyone = WorkflowRun.objects.all()
        self.assertEqual(everyone.count(), 1 + 2 + 4 + 4)
        self.assertEqual(set(everyone.values_list("status", flat=True)), {"cancelled"})
        self.assertEqual(set(leaves.values_list("depth", flat=True)), {3})

    def test_skipping_the_fan_out_cancels_its_children(self):
        wf = self.perform_next_step(Abandoned.start(count=2))
        wf.skip(reason="by hand")
        self.assertWorkflowStatus(wf, "finished")
        self.assertEqual([c.status for c in shipments_of(wf)], ["cancelled", "cancelled"])

    def test_pausing_a_parent_does_not_pause_its_children(self):
        order = Order.objects.create()
        wf = self.perform_next_step(ShipOrder.start(orders=[order.pk]))
        wf.pause()
        [child] = wf.children
        self.assertEqual(child.status, "ready")
        self.speedrun_workflow(child)
        self.assertWorkflowStatus(child, "finished")
        from pgbus_workflows.services.locks import resolve_if_done

        parked = WorkflowStep.objects.get(run_id=wf.record.pk, step_name="shipments")
        self.assertFalse(resolve_if_done(parked.pk, wf.record.pk))  # a paused parent waits for its resume
        wf.resume()
        self.assertWorkflowStatus(wf, "ready")

    def test_a_paused_child_is_still_running_for_its_parent(self):
        order = Order.objects.create()
        wf = self.perform_next_step(ShipOrder.start(orders=[order.pk]))
        [child] = wf.children
        child.pause()
        job = FanOutJob.objects.get(run_id=wf.record.pk)
        self.assertEqual(job.status, "running")
        with self.assertRaises(StepWaiting) as caught:
            self.complete_fan_out(wf)
        self.assertIn(f"Child {child!r}", str(caught.exception))
        child.resume()
        self.complete_fan_out(wf)
        self.assertWorkflowStatus(wf, "ready")


class Terminal(WorkflowTestMixin, TestCase):
    def test_workflows_show_names_the_parent_and_counts_the_children(self):
        from io import StringIO

        from django.core.management import call_command

        wf = self.perform_next_step(Many.start(count=3))
        self.speedrun_workflow(wf.children[0])
        out = StringIO()
        call_command("workflows", "show", str(wf.workflow_id), stdout=out)
        self.assertRegex(out.getvalue(), r'children +\{"finished": ?1, "ready": ?2\}')
        out = StringIO()
        call_command("workflows", "show", str(wf.children[1].workflow_id), "--json", stdout=out)
        self.assertIn(f'"parent": "{wf.workflow_id}"', out.getvalue())


class Results(WorkflowTestMixin, TestCase):
    def test_only_the_end_of_an_awaited_run_sends_a_notify(self):
        quiet, awaited = SlowChild.start(n=1), SlowChild.start(n=2)
        WorkflowRun.objects.filter(pk=awaited.record.pk).update(awaited=True)
        with statements_sent() as sent:
            self.perform_next_step(quiet)
        self.assertFalse([t for t in sent if "pg_notify" in t])
        with statements_sent() as sent:
            self.perform_next_step(awaited)
        self.assertEqual(len([t for t in sent if "pg_notify" in t]), 1)

    def test_result_of_a_cancelled_run_raises_workflow_cancelled(self):
        wf = Waiter.start(n=1)
        wf.cancel()
        with self.assertRaises(WorkflowCancelled) as caught:
            wf.result()
        self.assertEqual(caught.exception.workflow.workflow_id, wf.workflow_id)

    def test_a_negative_timeout_is_refused(self):
        with self.assertRaisesMessage(ValueError, "timeout must be >= 0"):
            Waiter.start(n=1).result(timeout=-1)


@pytest.mark.django_db(transaction=True)
class TestCommitted:
    """Behaviour that needs commits: the automatic resolution of a parent and result() from another thread."""

    def test_the_last_child_ending_resolves_its_parent_once_it_commits(self):
        wf = Many.start(count=3)
        run_next(wf)
        for child in wf.children:
            run_next(child)
        assert wf.reload().status == "ready"
        run_next(wf)
        assert wf.reload().status == "finished"
        assert wf.result(timeout=5) == 0 + 1 + 2

    def test_a_leafs_end_resolves_its_parent_then_its_grandparent_each_after_a_commit(self):
        root = Tree.start(depth=1, width=1)
        run_next(root)
        [child] = root.children
        run_next(child)
        [leaf] = child.children
        run_next(leaf)  # parks, waiting for "go"
        leaf.signal("go", 1)
        assert (child.reload().status, root.reload().status) == ("waiting", "waiting")
        run_next(leaf)
        assert leaf.reload().status == "finished"
        assert (child.reload().status, root.reload().status) == ("finished", "finished")

    def test_result_waits_for_the_end_and_returns_it(self, monkeypatch):
        # No re-read within the test: only the end's NOTIFY can wake the waiter.
        monkeypatch.setattr(results, "RECHECK_SECONDS", 3600.0)
        wf = Waiter.start(n=1)
        run_next(wf)  # parks, waiting for "go"
        waiter = Worker(lambda: Waiter.find(wf.workflow_id).result(timeout=30))
        waiter.start()
        eventually(lambda: WorkflowRun.objects.get(pk=wf.record.pk).awaited, what="the waiter to mark the run")
        assert waiter.is_alive()
        wf.signal("go", {"answer": 42})
        run_next(wf)
        assert waiter.finish() == {"answer": 42}

    def test_result_times_out(self):
        wf = Waiter.start(n=1)
        with pytest.raises(TimeoutError, match="did not end in time"):
            wf.result(timeout=0.2)
        assert WorkflowRun.objects.get(pk=wf.record.pk).awaited

    def test_result_racing_the_end_never_misses_it(self):
        for _ in range(10):
            wf = Waiter.start(n=1)
            run_next(wf)
            wf.signal("go", 7)
            waiter = Worker(lambda wf=wf: Waiter.find(wf.workflow_id).result(timeout=10))
            ender = Worker(lambda wf=wf: run_next(Waiter.find(wf.workflow_id)))
            waiter.start()
            ender.start()
            ender.finish()
            assert waiter.finish() == 7

    def test_a_lost_notification_only_delays_the_answer(self):
        wf = Waiter.start(n=1)
        run_next(wf)
        waiter = Worker(lambda: Waiter.find(wf.workflow_id).result(timeout=30))
        waiter.start()
        eventually(lambda: WorkflowRun.objects.get(pk=wf.record.pk).awaited, what="the waiter to mark the run")
        WorkflowRun.objects.filter(pk=wf.record.pk).update(awaited=False)  # its end now sends no NOTIFY
        wf.signal("go", "late")
        run_next(wf)
        assert waiter.finish() == "late"  # read again within RECHECK_SECONDS

    def test_without_listen_the_waiter_polls_until_the_end(self):
        from pgbus_workflows.services.results import _poll_until_ended  # the SQLite path, on any database

        wf = Waiter.start(n=1)
        run_next(wf)
        reads = []

        def counted(execute, text, params, many, context):
            reads.append(text)
            return execute(text, params, many, context)

        def poll():
            with connection.execute_wrapper(counted):  # the thread's own connection
                _poll_until_ended(wf.record, time.monotonic() + 30)

        waiter = Worker(poll)
        waiter.start()
        # Read twice: it did not take the first answer, a run still waiting, for the end.
        eventually(lambda: len(reads) >= 2, what="the waiter to read the status again")
        assert waiter.is_alive()
        wf.signal("go", 1)
        run_next(wf)
        waiter.finish()
        with pytest.raises(TimeoutError):
            _poll_until_ended(Waiter.start(n=2).record, time.monotonic() + 0.1)

    def test_result_inside_the_transaction_that_started_the_run_says_so(self):
        from django.db import transaction

        with transaction.atomic():
            wf = Waiter.start(n=1)
            with pytest.raises(WorkflowRun.DoesNotExist, match="commit it first"):
                wf.result(timeout=1)
        assert SideEffect.objects.count() == 0
