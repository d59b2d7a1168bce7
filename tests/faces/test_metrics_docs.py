"""The metrics and traces guide (docs/metrics.md) and docs/grafana-dashboard.json against what the code serves.

Every metric and label the guide's tables, its PromQL and the dashboard name is read from a
real scrape (the view, and the process registry after real attempts); the value lists the
guide gives are the code's.
"""

import itertools
import json
import re
from datetime import timedelta

from django.test import TestCase, override_settings
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pgbus_workflows import metrics, tracing
from pgbus_workflows.models import Dispatcher
from pgbus_workflows.services.outcome import OUTCOME_KINDS
from pgbus_workflows.services.stuck import STUCK_REASONS
from pgbus_workflows.sql import clock
from pgbus_workflows.states import StepOutcomeKind
from pgbus_workflows.testing import WorkflowTestMixin
from tests.procs import ROOT
from tests.testapp.workflows import Counted

SECTION = (ROOT / "docs" / "metrics.md").read_text()
DASHBOARD = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
METRIC = re.compile(r"\bpgbus_workflows_\w+")


def labels_by_sample(text: str) -> dict[str, set[str]]:
    """``{sample name: label names}`` of an exposition text."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def table_rows(heading_text: str) -> dict[str, set[str]]:
    """``{metric: labels}`` of the guide's table right after ``heading_text``."""
    lines = SECTION.split(heading_text, 1)[1].splitlines()
    first = next(number for number, line in enumerate(lines) if line.startswith("| metric |"))
    rows = {}
    for line in itertools.takewhile(lambda line: line.startswith("|"), lines[first:]):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].startswith("`pgbus_workflows_"):
            rows[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", cells[1]))
    return rows


def promql_block() -> list[str]:
    return SECTION.split("```promql\n", 1)[1].split("```", 1)[0].splitlines()


def listed(after: str) -> list[str]:
    """The backticked words of the parenthesis that follows ``after`` in the section."""
    text = " ".join(SECTION.split())
    return re.findall(r"`(\w+)`", text.split(after, 1)[1].split(")", 1)[0])


@override_settings(ROOT_URLCONF="tests.metrics_urls")
class DocumentedMetricsTests(WorkflowTestMixin, TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        metrics.install()

    def setUp(self):
        Dispatcher.objects.create(name="d", hostname="h", pid=1, heartbeat_at=clock.now() - timedelta(seconds=1))
        with self.captureOnCommitCallbacks(execute=True):
            self.speedrun_workflow(Counted.start())
        self.database = labels_by_sample(self.client.get("/metrics/").content.decode())
        self.process = labels_by_sample(generate_latest(REGISTRY).decode())
        self.served = {**self.database, **self.process}

    def families(self, served):
        return {name for name in served if name.startswith("pgbus_workflows_")}

    def test_the_tables_list_exactly_what_each_endpoint_serves_with_its_labels(self):
        view = table_rows("**What the database knows**")
        self.assertEqual(set(view), self.families(self.database))
        for name, labels in view.items():
            self.assertEqual(labels, self.database[name], name)
        dispatcher = table_rows("**What each dispatcher did**")
        histogram = "pgbus_workflows_step_duration_seconds"
        # prometheus_client adds a ``_created`` series to each counter and histogram of its own accord
        served = {
            re.sub(r"_(bucket|count|sum)$", "", n) for n in self.families(self.process) if not n.endswith("_created")
        }
        self.assertEqual(set(dispatcher), served)
        self.assertEqual(dispatcher["pgbus_workflows_attempts_total"], self.process["pgbus_workflows_attempts_total"])
        self.assertEqual(dispatcher[histogram], self.process[histogram + "_count"])

    def test_every_query_names_served_metrics_and_their_labels(self):
        queries = promql_block() + [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]
        for query in queries:
            names = METRIC.findall(query)
            self.assertTrue(names, query)
            known = set()
            for name in names:
                self.assertIn(name, self.served, query)
                known |= self.served[name]
            used = {label.strip() for group in re.findall(r"by \(([^)]*)\)", query) for label in group.split(",")}
            used |= set(re.findall(r"[{,](\w+)=~?", query))
            self.assertLessEqual(used, known, query)

    def test_the_promql_block_is_the_dashboard_s_queries_and_the_alert(self):
        exprs = [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]
        self.assertEqual(sorted(promql_block()), sorted([*exprs, "pgbus_workflows_dispatchers_live == 0"]))

    def test_the_dashboard_asks_for_its_prometheus_data_source(self):
        [variable] = DASHBOARD["templating"]["list"]
        self.assertEqual((variable["type"], variable["query"]), ("datasource", "prometheus"))
        for panel in DASHBOARD["panels"]:
            for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
                self.assertEqual(source, {"type": "prometheus", "uid": f"${{{variable['name']}}}"})
        titles = " ".join(panel["title"].lower() for panel in DASHBOARD["panels"])
        for subject in ("runs by status", "stuck", "live dispatchers", "heartbeat", "outcome", "failure", "duration"):
            self.assertIn(subject, titles)

    def test_the_value_lists_are_the_code_s(self):
        self.assertEqual(listed("runs by class and stuck reason ("), list(STUCK_REASONS))
        self.assertEqual(listed("`outcome` is the step row's ("), list(StepOutcomeKind.values))
        self.assertEqual(listed("`pgbus_workflows.outcome` ("), [*OUTCOME_KINDS, tracing.NO_OUTCOME])
        buckets = list(metrics.DURATION_BUCKETS)
        self.assertEqual((buckets[0], buckets[-1]), (0.005, 3600))
        self.assertIn("(5 ms to an hour)", SECTION)
