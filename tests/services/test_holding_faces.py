"""What a hold shows: a note in health (not a reason, and its due steps not overdue), and the metrics' gauge."""

from datetime import timedelta

from django.test import TestCase, override_settings

from pgbus_workflows import hold_class, hold_queue, release_class
from pgbus_workflows.models import Dispatcher
from pgbus_workflows.services.health import check_health
from pgbus_workflows.sql import clock
from pgbus_workflows.testing import WorkflowTestMixin
from tests.exposition import samples
from tests.testapp.held_workflows import FreeWork, HeldWork


class HoldFacesTests(WorkflowTestMixin, TestCase):
    def setUp(self):
        Dispatcher.objects.create(name="web-1", hostname="host", pid=1, heartbeat_at=clock.now())

    def test_a_held_class_is_a_note_and_its_due_steps_are_not_overdue_until_released(self):
        HeldWork.start()
        hold = hold_class(HeldWork, actor="ops", reason="mail down")
        self.advance(timedelta(hours=2))  # nothing claims it for two hours: on purpose
        Dispatcher.objects.update(heartbeat_at=clock.now())

        health = check_health()

        self.assertTrue(health.healthy)
        self.assertEqual(health.stuck["overdue"], 0)
        self.assertEqual(health.notes, [f"class held_work held since {hold.held_at.isoformat()} by ops"])
        self.assertEqual(health.as_dict()["holds"][0]["reason"], "mail down")
        release_class(HeldWork)
        self.assertEqual(check_health().reasons, ["1 run with a step due for longer than STALL_THRESHOLD"])

    def test_a_held_queues_due_steps_are_not_overdue_either(self):
        FreeWork.start()
        hold_queue("free", reason="failover")
        self.advance(timedelta(hours=2))
        Dispatcher.objects.update(heartbeat_at=clock.now())
        self.assertEqual(check_health().stuck["overdue"], 0)

    @override_settings(ROOT_URLCONF="tests.metrics_urls")
    def test_the_metrics_have_one_sample_per_hold(self):
        hold_class(HeldWork, reason="x")
        hold_queue("free", reason="y")

        table = samples(self.client.get("/metrics/").content.decode())

        self.assertEqual(table[("pgbus_workflows_holds", (("kind", "class"), ("name", "held_work")))], 1)
        self.assertEqual(table[("pgbus_workflows_holds", (("kind", "queue"), ("name", "free")))], 1)
        release_class(HeldWork)
        table = samples(self.client.get("/metrics/").content.decode())
        self.assertEqual(
            [pairs for m, pairs in table if m == "pgbus_workflows_holds"], [(("kind", "queue"), ("name", "free"))]
        )
