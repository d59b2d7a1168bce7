"""pgbus_workflows.metrics: the database's counts in the view, the attempts a process ended in its registry.

The view's output is read back with prometheus_client's own parser; the process counters
after real runs through the test helpers (the real executor, the real signals).
"""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.test import TestCase, override_settings
from prometheus_client import REGISTRY, generate_latest

from pgbus_workflows import metrics
from pgbus_workflows.dispatcher.sweep import stall_overdue_steps
from pgbus_workflows.models import Dispatcher, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.sql import clock
from pgbus_workflows.testing import WorkflowTestMixin
from tests.exposition import samples, value
from tests.procs import ROOT, database_url
from tests.testapp.workflows import Counted, FailsFirst, Slow


def django_env() -> dict[str, str]:
    """The environment of a Django process of the test project on the test database."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
    }


def process_samples():
    return samples(generate_latest(REGISTRY).decode())


@override_settings(ROOT_URLCONF="tests.metrics_urls")
class MetricsViewTests(TestCase):
    def scrape(self, **headers):
        response = self.client.get("/metrics/", headers=headers)
        self.assertEqual(response.status_code, 200)
        return response

    def test_serves_runs_by_class_and_status_and_stuck_reason_from_the_database(self):
        Counted.start()
        Counted.start()
        FailsFirst.start()
        response = self.scrape()
        self.assertEqual(response["Content-Type"], "text/plain; version=0.0.4; charset=utf-8")
        table = samples(response.content.decode())
        self.assertEqual(value(table, "pgbus_workflows_runs", workflow_class="counted", status="ready"), 2)
        self.assertEqual(value(table, "pgbus_workflows_runs", workflow_class="fails_first", status="ready"), 1)
        # zero-filled: a status no run has is reported as 0, so a count that drops to zero shows
        self.assertIn(("pgbus_workflows_runs", (("status", "finished"), ("workflow_class", "counted"))), table)
        self.assertEqual(value(table, "pgbus_workflows_runs", workflow_class="counted", status="finished"), 0)
        self.assertEqual(
            value(table, "pgbus_workflows_stuck_runs", workflow_class="fails_first", reason="paused_on_error"), 0
        )

    def test_a_run_paused_on_its_error_counts_as_stuck(self):
        wf = FailsFirst.start()
        WorkflowTestMixin().speedrun_workflow(wf)
        self.assertEqual(wf.reload().status, "paused")
        table = samples(self.scrape().content.decode())
        self.assertEqual(value(table, "pgbus_workflows_runs", workflow_class="fails_first", status="paused"), 1)
        self.assertEqual(
            value(table, "pgbus_workflows_stuck_runs", workflow_class="fails_first", reason="paused_on_error"), 1
        )

    def test_dispatcher_liveness_from_the_heartbeats(self):
        now = clock.now()
        Dispatcher.objects.create(name="live", hostname="a", pid=1, heartbeat_at=now, workers_alive=3)
        Dispatcher.objects.create(name="gone", hostname="b", pid=2, heartbeat_at=now - timedelta(minutes=5))
        table = samples(self.scrape().content.decode())
        self.assertEqual(value(table, "pgbus_workflows_dispatcher_up", dispatcher="live", hostname="a"), 1)
        self.assertEqual(value(table, "pgbus_workflows_dispatcher_up", dispatcher="gone", hostname="b"), 0)
        self.assertEqual(value(table, "pgbus_workflows_dispatcher_workers_alive", dispatcher="live", hostname="a"), 3)
        age = value(table, "pgbus_workflows_dispatcher_heartbeat_age_seconds", dispatcher="gone", hostname="b")
        self.assertGreaterEqual(age, 300)
        self.assertEqual(value(table, "pgbus_workflows_dispatchers_live"), 1)

    def test_answers_openmetrics_when_the_scraper_asks_for_it(self):
        response = self.scrape(Accept="application/openmetrics-text; version=1.0.0")
        self.assertTrue(response["Content-Type"].startswith("application/openmetrics-text"))
        self.assertTrue(response.content.decode().endswith("# EOF\n"))

    def test_does_no_access_check_of_its_own_and_answers_only_get_and_head(self):
        self.client.logout()
        self.scrape()
        self.assertEqual(self.client.head("/metrics/").status_code, 200)
        self.assertEqual(self.client.post("/metrics/").status_code, 405)
        self.assertEqual(self.client.put("/metrics/").status_code, 405)

    def test_the_collector_queries_only_when_collected(self):
        collector = metrics.DatabaseCollector()
        with self.assertNumQueries(0):
            REGISTRY.register(collector)  # prometheus_client's default registry describes what it registers
        try:
            Counted.start()
            table = samples(generate_latest(REGISTRY).decode())
        finally:
            REGISTRY.unregister(collector)
        self.assertEqual(value(table, "pgbus_workflows_runs", workflow_class="counted", status="ready"), 1)


class ProcessCounterTests(WorkflowTestMixin, TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        metrics.install()

    def test_attempts_by_outcome_after_real_runs(self):
        before = process_samples()
        with self.captureOnCommitCallbacks(execute=True):  # the signals are sent after commit
            for _ in range(2):
                self.speedrun_workflow(Counted.start())
            self.speedrun_workflow(FailsFirst.start())
        after = process_samples()

        def delta(**labels):
            name = "pgbus_workflows_attempts_total"
            return value(after, name, **labels) - value(before, name, **labels)

        for step in ("first", "second", "third"):
            self.assertEqual(delta(workflow_class="counted", step=step, outcome="success"), 2)
        self.assertEqual(delta(workflow_class="fails_first", step="flaky", outcome="failed"), 1)
        self.assertEqual(delta(workflow_class="fails_first", step="flaky", outcome="success"), 0)

    def test_install_twice_counts_each_attempt_once(self):
        metrics.install()
        before = process_samples()
        with self.captureOnCommitCallbacks(execute=True):
            self.speedrun_workflow(Counted.start())
        after = process_samples()
        labels = {"workflow_class": "counted", "step": "first", "outcome": "success"}
        name = "pgbus_workflows_attempts_total"
        self.assertEqual(value(after, name, **labels) - value(before, name, **labels), 1)

    def test_the_process_registry_never_queries_the_database(self):
        with self.captureOnCommitCallbacks(execute=True):
            self.speedrun_workflow(Counted.start())
        with self.assertNumQueries(0):
            text = generate_latest(REGISTRY).decode()
        self.assertIn("pgbus_workflows_attempts_total{", text)

    def test_the_process_that_sweeps_counts_the_attempts_the_sweep_stalls(self):
        wf = Counted.start()
        claim_due_steps(1, claimed_by="gone")
        WorkflowStep.objects.filter(run=wf.record).update(stall_at=clock.now() - timedelta(seconds=1))
        before = process_samples()
        with self.captureOnCommitCallbacks(execute=True):
            self.assertEqual(stall_overdue_steps(clock.now()), 1)
        after = process_samples()
        labels = {"workflow_class": "counted", "step": "first", "outcome": "stalled"}
        name = "pgbus_workflows_attempts_total"
        self.assertEqual(value(after, name, **labels) - value(before, name, **labels), 1)

    def test_an_attempt_ended_before_it_started_counts_without_a_duration(self):
        wf = Counted.start()
        before = process_samples()
        with self.captureOnCommitCallbacks(execute=True):
            wf.cancel("not needed")
        after = process_samples()
        labels = {"workflow_class": "counted", "step": "first"}
        attempts = "pgbus_workflows_attempts_total"
        self.assertEqual(
            value(after, attempts, outcome="cancelled", **labels)
            - value(before, attempts, outcome="cancelled", **labels),
            1,
        )
        durations = "pgbus_workflows_step_duration_seconds_count"
        self.assertEqual(value(after, durations, **labels), value(before, durations, **labels))

    def test_step_durations_from_the_claim_to_the_end(self):
        before = process_samples()
        with self.captureOnCommitCallbacks(execute=True):
            self.run_step_inline(Slow.start(seconds=0.05), "work")
        after = process_samples()
        name = "pgbus_workflows_step_duration_seconds"

        def delta(suffix, **labels):
            key = {"workflow_class": "slow", "step": "work", **labels}
            return value(after, name + suffix, **key) - value(before, name + suffix, **key)

        self.assertEqual(delta("_count"), 1)
        self.assertGreaterEqual(delta("_sum"), 0.05)
        self.assertEqual(delta("_bucket", le="0.025"), 0)  # the body alone slept 50 ms
        self.assertEqual(delta("_bucket", le="+Inf"), 1)


@pytest.mark.processes
def test_without_prometheus_client_the_app_works_and_the_module_names_the_extra(db):
    script = (
        "import sys; sys.modules['prometheus_client'] = None\n"  # as if it were not installed
        "import django; django.setup()\n"
        "import pgbus_workflows, pgbus_workflows.services.executor\n"
        "try:\n    import pgbus_workflows.metrics\n"
        "except ImportError as error:\n    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=django_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "pgbus_workflows.metrics needs prometheus-client: pip install 'pgbus-workflows[prometheus]'"
    )


@pytest.mark.processes
@pytest.mark.parametrize("bad", ["0", "65536", "http"])
def test_a_bad_metrics_port_is_refused_by_the_command_line(bad, db):
    done = subprocess.run(
        [sys.executable, "-m", "django", "run_workflow_dispatcher", "--metrics-port", bad],
        cwd=ROOT,
        env=django_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--metrics-port" in done.stderr.splitlines()[-1]
