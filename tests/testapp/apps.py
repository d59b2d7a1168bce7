import os
import time

from django.apps import AppConfig


class TestappConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import chaos_workflows, deploy_workflows, fault_workflows  # noqa: F401 - registers their workflows

        if os.environ.get("TESTAPP_SLOW_GAUGE"):
            # A metrics receiver that takes its time (test_fault_processes): the sweep thread
            # is stuck in it while claims and heartbeats must go on.
            from pgbus_workflows.signals import workflow_gauge

            workflow_gauge.connect(slow_gauge_receiver, dispatch_uid="testapp-slow-gauge")
        if os.environ.get("TESTAPP_SPAN_FILE"):
            # OpenTelemetry's SDK in a dispatcher process (test_observability_processes): every
            # span ended is written at once to the file, one JSON document a line.
            export_spans_to(os.environ["TESTAPP_SPAN_FILE"])


def slow_gauge_receiver(sender, **kwargs):
    from .models import SideEffect

    SideEffect.objects.create(label="gauge-start")
    time.sleep(float(os.environ["TESTAPP_SLOW_GAUGE"]))
    SideEffect.objects.create(label="gauge-end")


def export_spans_to(path):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = open(path, "a")  # open for the life of the process
    provider = TracerProvider()
    exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
