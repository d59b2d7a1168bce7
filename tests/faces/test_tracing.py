"""pgbus_workflows.tracing: a span per attempt, a child of the span that called start().

Spans are read from OpenTelemetry's SDK: its InMemorySpanExporter for attempts run inline
by the test helpers, a JSON-lines file (tests/testapp/apps.py) for a real dispatcher process.
"""

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from django.test import TestCase
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pgbus_workflows import Workflow, step, tracing
from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.testing import WorkflowTestMixin
from tests.procs import ROOT, database_url
from tests.testapp.async_workflows import AsyncPing
from tests.testapp.workflows import Approval, Counted, FailsFirst

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracer_provider():
    """The SDK's provider with the in-memory exporter, set once for the process (OpenTelemetry
    allows one); the exporter is stopped after this module, so later tests keep nothing."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        provider.add_span_processor(WATCHER)
        trace.set_tracer_provider(provider)
    yield
    EXPORTER.shutdown()


class AttemptRowWatcher(SpanProcessor):
    """While ``rows`` is a list, the status of the attempt's row when its span starts and ends."""

    rows: list | None = None

    def read(self, span):
        attributes = span.attributes or {}
        if self.rows is not None and "pgbus_workflows.step" in attributes:
            self.rows.append(
                WorkflowStep.objects.filter(
                    run__workflow_id=attributes["pgbus_workflows.workflow_id"],
                    step_name=attributes["pgbus_workflows.step"],
                    attempt=attributes["pgbus_workflows.attempt"],
                )
                .values_list("status", flat=True)
                .get()
            )

    def on_start(self, span, parent_context=None):
        self.read(span)

    def on_end(self, span):
        self.read(span)


WATCHER = AttemptRowWatcher()


@pytest.fixture(autouse=True)
def no_spans_yet():
    EXPORTER.clear()


def attempt_spans():
    return [span for span in EXPORTER.get_finished_spans() if "pgbus_workflows.step" in (span.attributes or {})]


TRACER = trace.get_tracer("tests")


class Nested(Workflow):
    """A body that makes a span of its own."""

    name = "tracing_nested"

    @step
    def call(self):
        with TRACER.start_as_current_span("http call"):
            pass


class AttemptSpanTests(WorkflowTestMixin, TestCase):
    def test_each_attempt_is_a_child_of_the_span_that_started_the_run(self):
        with TRACER.start_as_current_span("request") as request:
            wf = Counted.start()
        self.speedrun_workflow(wf)
        spans = attempt_spans()
        self.assertEqual([span.name for span in spans], ["counted.first", "counted.second", "counted.third"])
        caller = request.get_span_context()
        for number, span in enumerate(spans):
            self.assertEqual(span.context.trace_id, caller.trace_id)
            self.assertEqual(span.parent.span_id, caller.span_id)
            self.assertEqual(span.kind, SpanKind.CONSUMER)
            self.assertEqual(
                dict(span.attributes),
                {
                    "pgbus_workflows.workflow_class": "counted",
                    "pgbus_workflows.workflow_id": str(wf.workflow_id),
                    "pgbus_workflows.step": ["first", "second", "third"][number],
                    "pgbus_workflows.attempt": 1,
                    "pgbus_workflows.outcome": "success",
                },
            )
            self.assertEqual(span.status.status_code, StatusCode.UNSET)

    def test_children_join_their_parent_s_trace(self):
        from tests.testapp.child_workflows import Many

        with TRACER.start_as_current_span("request") as request:
            wf = Many.start(count=2)
        self.perform_next_step(wf)
        self.complete_fan_out(wf)
        caller = request.get_span_context()
        children = [span for span in attempt_spans() if span.name == "slow_child.nap"]
        self.assertEqual(len(children), 2)
        self.assertEqual({span.context.trace_id for span in children}, {caller.trace_id})
        self.assertEqual({span.parent.span_id for span in children}, {caller.span_id})

    def test_a_failed_attempt_has_error_status_and_its_exception(self):
        with TRACER.start_as_current_span("request"):
            wf = FailsFirst.start()
        self.speedrun_workflow(wf)  # pauses on the first attempt's error
        self.speedrun_workflow(wf.resume())
        failed, retried, after = attempt_spans()
        self.assertEqual(failed.attributes["pgbus_workflows.outcome"], "error")
        self.assertEqual(failed.status.status_code, StatusCode.ERROR)
        self.assertEqual(failed.status.description, "RuntimeError: the first attempt fails")
        [event] = failed.events
        self.assertEqual(event.name, "exception")
        self.assertEqual(event.attributes["exception.type"], "RuntimeError")
        self.assertEqual(
            (retried.attributes["pgbus_workflows.attempt"], retried.status.status_code), (2, StatusCode.UNSET)
        )
        self.assertEqual(after.name, "fails_first.after")
        self.assertEqual(len({span.context.trace_id for span in (failed, retried, after)}), 1)

    def test_an_attempt_that_parks_for_a_signal_has_no_outcome(self):
        wf = Approval.start()
        self.perform_next_step(wf)
        self.assertEqual(wf.reload().status, "waiting")
        [parked] = attempt_spans()
        self.assertEqual(parked.attributes["pgbus_workflows.outcome"], tracing.NO_OUTCOME)
        self.deliver_signal(wf, "approved", {"ok": True})
        woken = attempt_spans()[1]
        self.assertEqual((woken.name, woken.attributes["pgbus_workflows.outcome"]), ("approval.approve", "success"))

    def test_the_span_covers_the_guards_and_the_body_and_the_outcome_is_written_after(self):
        wf = Counted.start()
        WATCHER.rows = []
        try:
            self.perform_next_step(wf)
        finally:
            rows, WATCHER.rows = WATCHER.rows, None
        # claimed before the span starts; its outcome still unwritten when the span ends
        self.assertEqual(rows, ["in_progress", "in_progress"])
        self.assertEqual(WorkflowStep.objects.get(run_id=wf.record.pk, step_name="first").status, "completed")

    def test_the_body_s_own_spans_are_children_of_the_attempt(self):
        self.speedrun_workflow(Nested.start())
        [inner] = [span for span in EXPORTER.get_finished_spans() if span.name == "http call"]
        [attempt] = attempt_spans()
        self.assertEqual(inner.parent.span_id, attempt.context.span_id)

    def test_a_run_started_outside_any_span_saves_nothing_and_its_attempts_are_roots(self):
        wf = Counted.start()
        self.assertIsNone(WorkflowRun.objects.get(pk=wf.record.pk).trace_context)
        self.perform_next_step(wf)
        [span] = attempt_spans()
        self.assertIsNone(span.parent)

    def test_start_many_saves_the_caller_s_context_on_every_run(self):
        with TRACER.start_as_current_span("import") as caller:
            handles = Counted.start_many([None, None, {"arguments": {"n": 1}}])
        context = caller.get_span_context()
        traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        saved = WorkflowRun.objects.filter(pk__in=[wf.record.pk for wf in handles]).values_list(
            "trace_context", flat=True
        )
        self.assertEqual(list(saved), [{"traceparent": traceparent}] * 3)
        self.perform_next_step(handles[2])
        [span] = attempt_spans()
        self.assertEqual(span.parent.span_id, context.span_id)

    def test_baggage_is_not_stored_only_the_w3c_trace_context(self):
        from opentelemetry import baggage, context

        # Several entries, each under the W3C propagator's 4,096-byte limit of one entry: about 8 KB in all.
        bagged = context.get_current()
        for n in range(4):
            bagged = baggage.set_baggage(f"user.profile{n}", "x" * 1900, context=bagged)
        token = context.attach(bagged)
        try:
            with TRACER.start_as_current_span("request") as caller:
                wf = Counted.start()
        finally:
            context.detach(token)
        span = caller.get_span_context()
        saved = WorkflowRun.objects.get(pk=wf.record.pk).trace_context
        self.assertEqual(saved, {"traceparent": f"00-{span.trace_id:032x}-{span.span_id:016x}-{span.trace_flags:02x}"})
        self.perform_next_step(wf)
        [attempt] = attempt_spans()
        self.assertEqual(attempt.parent.span_id, span.span_id)

    def test_tracestate_is_kept_up_to_512_characters_in_whole_entries(self):
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

        def started_under(state):
            parent = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1), trace_state=state)
            with trace.use_span(NonRecordingSpan(parent)):
                wf = Counted.start()
            return WorkflowRun.objects.get(pk=wf.record.pk).trace_context

        short = TraceState([("vendor", "abc")])
        self.assertEqual(started_under(short)["tracestate"], "vendor=abc")
        long = TraceState([(f"v{i:02d}", "y" * 40) for i in range(30)])  # 30 entries of 44 characters
        kept = started_under(long)["tracestate"]
        self.assertLessEqual(len(kept), tracing.MAX_TRACESTATE)
        self.assertEqual(kept, ",".join(f"v{i:02d}={'y' * 40}" for i in range(11)))  # 11 * 45 - 1 = 494


class Ended:
    """An outcome as the span reads one."""

    def __init__(self, kind, error=None):
        self.kind, self.error = kind, error


@pytest.mark.django_db
def test_an_attempt_span_is_current_inside_and_ends_with_the_outcome_it_was_told():
    Counted.start()
    attempt = WorkflowStep.objects.select_related("run").get()
    with tracing.attempt_span(attempt) as span:
        inside = trace.get_current_span()
        span.ended(Ended("stall", TimeoutError("past its timeout")))
    (ended,) = attempt_spans()
    assert inside.get_span_context().span_id == ended.context.span_id
    assert ended.attributes["pgbus_workflows.outcome"] == "stall"
    assert ended.status.description == "TimeoutError: past its timeout"


@pytest.mark.django_db
def test_an_exception_out_of_an_attempt_span_ends_it_with_the_exception_and_goes_on():
    Counted.start()
    attempt = WorkflowStep.objects.select_related("run").get()
    with pytest.raises(KeyError), tracing.attempt_span(attempt):
        raise KeyError("lost")
    (ended,) = attempt_spans()
    assert [event.name for event in ended.events] == ["exception"]
    assert ended.end_time is not None


@pytest.mark.django_db
def test_an_attempt_span_told_it_settles_later_ends_when_it_is_settled():
    Counted.start()
    attempt = WorkflowStep.objects.select_related("run").get()
    callbacks = []

    class Later:
        def when_settled(self, callback):
            callbacks.append(callback)

    with tracing.attempt_span(attempt) as span:
        span.settles_later(Later())
    assert attempt_spans() == []
    callbacks[0](Ended("success"))
    (ended,) = attempt_spans()
    assert ended.attributes["pgbus_workflows.outcome"] == "success"


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_real_dispatcher_process_continues_the_caller_s_trace(dispatchers, tmp_path):
    spans = tmp_path / "spans.jsonl"
    with TRACER.start_as_current_span("request") as request:
        runs = [Counted.start() for _ in range(2)]
    process = dispatchers("--once", env={"TESTAPP_SPAN_FILE": str(spans)})
    assert process.wait() == 0, process.output()
    exported = [json.loads(line) for line in spans.read_text().splitlines()]
    attempts = [span for span in exported if "pgbus_workflows.step" in span["attributes"]]
    caller = request.get_span_context()
    assert sorted((span["attributes"]["pgbus_workflows.workflow_id"], span["name"]) for span in attempts) == sorted(
        (str(wf.workflow_id), f"counted.{name}") for wf in runs for name in ("first", "second", "third")
    )
    for span in attempts:
        assert span["context"]["trace_id"] == f"0x{caller.trace_id:032x}"
        assert span["parent_id"] == f"0x{caller.span_id:016x}"
        assert span["attributes"]["pgbus_workflows.outcome"] == "success"


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_an_async_body_awaited_on_the_dispatcher_s_loop_ends_its_span_with_its_outcome(dispatchers, tmp_path):
    spans = tmp_path / "spans.jsonl"
    with TRACER.start_as_current_span("request") as request:
        wf = AsyncPing.start(n=7)
    process = dispatchers("--once", env={"TESTAPP_SPAN_FILE": str(spans)})
    assert process.wait() == 0, process.output()
    exported = [json.loads(line) for line in spans.read_text().splitlines()]
    attempts = [span for span in exported if "pgbus_workflows.step" in span["attributes"]]
    assert sorted(span["name"] for span in attempts) == ["async_ping.call", "async_ping.record"]
    caller = request.get_span_context()
    for span in attempts:
        assert span["attributes"]["pgbus_workflows.workflow_id"] == str(wf.workflow_id)
        assert span["parent_id"] == f"0x{caller.span_id:016x}"
        assert span["attributes"]["pgbus_workflows.outcome"] == "success"
    call = next(span for span in attempts if span["name"] == "async_ping.call")
    start, end = (call[key].replace("Z", "+00:00") for key in ("start_time", "end_time"))
    assert datetime.fromisoformat(end) - datetime.fromisoformat(start) >= timedelta(seconds=0.05), (
        "the span lasts as long as the awaited body"
    )


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_without_either_extra_runs_start_and_run_and_save_no_context():
    script = (
        "import sys; sys.modules['opentelemetry'] = sys.modules['prometheus_client'] = None\n"  # not installed
        "import django; django.setup()\n"
        "from pgbus_workflows import tracing\n"
        "from pgbus_workflows.services.executor import run_due_steps\n"
        "from tests.testapp.workflows import Counted\n"
        "wf = Counted.start()\n"
        "print(tracing.available(), run_due_steps(), wf.reload().status, wf.record.trace_context)\n"
    )
    environment = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "3", "finished", "None"]
    assert WorkflowRun.objects.get().status == "finished"
