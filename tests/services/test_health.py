"""Health: the verdict and its reasons, from the read model, ``manage.py workflows health`` and the view."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client, TestCase, override_settings
from django.urls import path

import pgbus_workflows.views
from pgbus_workflows import Workflow, step
from pgbus_workflows.models import Dispatcher, WorkflowSchedule
from pgbus_workflows.services.health import check_health
from pgbus_workflows.sql import clock
from pgbus_workflows.testing import WorkflowTestMixin
from tests.testapp.models import Order

urlpatterns = [path("health/", pgbus_workflows.views.health_view)]


class HealthChecked(Workflow):
    name = "health_checked"

    @step
    def first(self):
        return None


class HealthFails(Workflow):
    name = "health_fails"

    @step
    def first(self):
        raise ValueError("the address was refused")


def beating(name="web-1", ago=timedelta(0)):
    return Dispatcher.objects.create(name=name, hostname="host", pid=1, heartbeat_at=clock.now() - ago)


@override_settings(ROOT_URLCONF=__name__)
class HealthTests(WorkflowTestMixin, TestCase):
    def setUp(self):
        self.order = Order.objects.create()

    def test_with_no_dispatcher_it_is_not_healthy_and_says_why(self):
        health = check_health()
        self.assertFalse(health.healthy)
        self.assertEqual(health.reasons, ["no dispatcher is alive (no dispatcher has registered)"])

    def test_a_live_dispatcher_and_nothing_stuck_is_healthy(self):
        beating()
        HealthChecked.start(self.order)
        health = check_health()
        self.assertEqual((health.healthy, health.reasons, health.notes), (True, [], []))
        self.assertEqual([beat.alive for beat in health.dispatchers], [True])
        self.assertIsNotNone(health.oldest_due_seconds)  # the run's first step is due now

    def test_a_dispatcher_silent_past_dead_after_is_not_alive(self):
        beating(ago=timedelta(minutes=5))
        health = check_health()
        self.assertFalse(health.healthy)
        self.assertIn("no dispatcher is alive (the last heartbeat was at", health.reasons[0])
        beating("web-2")
        health = check_health()
        self.assertTrue(health.healthy)
        self.assertEqual(health.notes, ["dispatcher rows whose process is gone: web-1"])

    def test_a_step_due_for_longer_than_the_stall_threshold_makes_it_not_healthy(self):
        HealthChecked.start(self.order)
        self.advance(timedelta(hours=2))  # nothing claimed it for two hours
        beating()
        health = check_health()
        self.assertFalse(health.healthy)
        self.assertEqual(health.reasons, ["1 run with a step due for longer than STALL_THRESHOLD"])
        self.assertEqual(health.stuck["overdue"], 1)
        self.assertGreaterEqual(health.oldest_due_seconds, 2 * 3600)

    def test_a_run_paused_on_an_error_is_a_note_not_a_reason(self):
        beating()
        self.speedrun_workflow(HealthFails.start(self.order))
        health = check_health()
        self.assertTrue(health.healthy)
        self.assertEqual(health.notes, ["1 run paused on an error"])

    def test_a_schedule_whose_last_tick_failed_makes_it_not_healthy_until_one_fires(self):
        beating()
        schedule = HealthChecked.add_schedule(every=timedelta(hours=1), name="hourly")
        failed_at = clock.now()
        WorkflowSchedule.objects.filter(pk=schedule.pk).update(last_error="boom", last_error_at=failed_at)
        health = check_health()
        self.assertEqual(health.reasons, [f"schedule health_checked/hourly failed at {failed_at.isoformat()}"])
        self.assertEqual(health.failing_schedules[0]["last_error"], "boom")
        WorkflowSchedule.objects.filter(pk=schedule.pk).update(last_fired_at=clock.now() + timedelta(seconds=1))
        self.assertTrue(check_health().healthy)

    def test_the_command_prints_the_verdict_and_exits_1_when_not_healthy(self):
        out = StringIO()
        with self.assertRaisesMessage(CommandError, "not healthy: no dispatcher is alive"):
            call_command("workflows", "health", stdout=out)
        self.assertTrue(out.getvalue().startswith("NOT HEALTHY\n  - no dispatcher is alive"))
        beating()
        out = StringIO()
        call_command("workflows", "health", stdout=out)
        self.assertEqual(out.getvalue().splitlines()[0], "healthy")
        self.assertIn("web-1", out.getvalue())
        out = StringIO()
        call_command("workflows", "health", "--json", stdout=out)
        report = json.loads(out.getvalue())
        self.assertEqual((report["healthy"], report["dispatchers"][0]["name"]), (True, "web-1"))

    def test_the_view_answers_503_then_200_with_the_verdict_and_nothing_more(self):
        response = Client().get("/health/")
        self.assertEqual(response.status_code, 503)
        self.assertEqual(set(response.json()), {"healthy", "reasons", "checked_at"})
        self.assertFalse(response.json()["healthy"])
        beating()
        response = Client().get("/health/")
        self.assertEqual((response.status_code, response.json()["reasons"]), (200, []))
        self.assertEqual(Client().post("/health/").status_code, 405)


def plan_nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


@pytest.mark.django_db
def test_the_oldest_due_step_is_read_without_walking_the_steps_due_later():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from pgbus_workflows.sql.counting import oldest_due_at

    HealthChecked.start(Order.objects.create())  # one step due now
    with connection.cursor() as cursor:  # 5,000 runs whose step waits for next week
        cursor.execute(
            "INSERT INTO pgbus_workflows_workflowrun (workflow_id, workflow_class, status, current_step, arguments,"
            " allow_multiple, paused_reason, created_at, started_at, status_changed_at)"
            " SELECT gen_random_uuid(), 'health_checked', 'ready', 'first', '{}', true, '', now(), now(), now()"
            " FROM generate_series(1, 5000)"
        )
        cursor.execute(
            "INSERT INTO pgbus_workflows_workflowstep (run_id, step_name, attempt, status, outcome, reattempt_reason,"
            " queue, priority, scheduled_at, claimed_by, error_class, error_message, traceback, timed_out, created_at,"
            " held) SELECT id, 'first', 1, 'scheduled', '', '', 'workflows', 0, now() + interval '7 days', '', '',"
            " '', '', false, now(), false FROM pgbus_workflows_workflowrun WHERE current_step = 'first'"
            " AND started_at IS NOT NULL AND id NOT IN (SELECT run_id FROM pgbus_workflows_workflowstep)"
        )
        cursor.execute("ANALYZE pgbus_workflows_workflowstep")
        now = clock.now()
        with CaptureQueriesContext(connection) as captured:
            due = oldest_due_at(now)
        [query] = captured.captured_queries
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query["sql"])
        nodes = list(plan_nodes(cursor.fetchone()[0][0]["Plan"]))
    assert due is not None and due <= now
    read = [
        n.get("Actual Rows", 0) * n.get("Actual Loops", 1) + n.get("Rows Removed by Filter", 0)
        for n in nodes
        if n.get("Relation Name") == "pgbus_workflows_workflowstep"
    ]
    assert sum(read) < 50, (sum(read), nodes)
