"""OpenTelemetry traces (the ``pgbus-workflows[otel]`` extra): a span per step attempt, in its caller's trace.

``start()`` and ``start_many()`` save the trace context of the span current at the call on the
run row, ``trace_context``: its W3C ``traceparent``, and its ``tracestate`` when that is at most
:data:`MAX_TRACESTATE` characters (whole entries are dropped from the end to fit). Baggage and
whatever else the global propagator carries are not kept: they are the caller's, unbounded, and a
run's attempts need only their parent span. The dispatcher restores it around each attempt, so the
attempt's span is a child of the span that started the run, and the spans a body makes are
children of the attempt's.

Without opentelemetry-api, or with no span current at ``start()``, nothing is saved; without a
tracer provider configured (``trace.set_tracer_provider``), attempts make no span. Either way
the hooks cost a check or two, no call into OpenTelemetry's span machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    #: Injects and extracts the W3C trace context only, whatever the global propagator adds.
    _w3c = TraceContextTextMapPropagator()

    #: A proxy until a provider is set, then that provider's tracer (getting one costs more than a span).
    _tracer = trace.get_tracer("pgbus_workflows")
except ImportError:  # the extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

T = TypeVar("T")

#: The outcome attribute of an attempt that ended without an outcome of its own: it parked
#: for a signal, it was no longer in progress, or an ``atomic=True`` body stalled.
NO_OUTCOME = "none"
#: Outcomes that mark the attempt's span as an error.
ERROR_OUTCOMES = frozenset({"error", "stall"})

#: The longest ``tracestate`` kept on a run (the W3C limit every vendor must propagate).
MAX_TRACESTATE = 512

#: The last context injected and its carrier: ``start_many()`` injects once for all its runs.
_last: tuple[Any, dict[str, str]] | None = None


def available() -> bool:
    """True when opentelemetry-api is installed."""
    return trace is not None


def carrier() -> dict[str, str] | None:
    """The current trace context as the propagator injects it; None when no span is current."""
    global _last
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    current = otel_context.get_current()
    last = _last
    if last is not None and last[0] is current:
        return last[1]
    injected: dict[str, str] = {}
    _w3c.inject(injected, context=current)
    kept = {"traceparent": injected["traceparent"]} if "traceparent" in injected else {}
    state = _bounded_tracestate(injected.get("tracestate", ""))
    if state:
        kept["tracestate"] = state
    _last = (current, kept)
    return kept or None


def _bounded_tracestate(state: str) -> str:
    """``state`` cut to at most :data:`MAX_TRACESTATE` characters by dropping whole entries from its end."""
    kept: list[str] = []
    for entry in state.split(","):
        if len(",".join([*kept, entry])) > MAX_TRACESTATE:
            break
        kept.append(entry)
    return ",".join(kept)


def traced_attempt(step: Any, perform: Callable[[], T]) -> T:
    """``perform()`` (the attempt of the claimed ``step``) inside its span, when tracing is on.

    ``step`` is a :class:`~pgbus_workflows.models.WorkflowStep`, typed ``Any``: this module is
    in the layer below the models, and importing them, even for the annotation, would be an
    edge upwards.

    The span, named ``<workflow class>.<step>``, is a child of the context saved on the run
    (when there is one) and current while the attempt runs. Its attributes:
    ``pgbus_workflows.workflow_class``, ``.workflow_id``, ``.step``, ``.attempt`` and
    ``.outcome`` (the ``StepOutcome`` kind, or :data:`NO_OUTCOME`); an ``error`` or ``stall``
    outcome sets its status to error, with the exception recorded.
    """
    if trace is None or isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
        return perform()
    run = step.run
    parent = _w3c.extract(run.trace_context) if run.trace_context else None
    attributes: dict[str, str | int] = {
        "pgbus_workflows.workflow_class": run.workflow_class,
        "pgbus_workflows.workflow_id": str(run.workflow_id),
        "pgbus_workflows.step": step.step_name,
        "pgbus_workflows.attempt": step.attempt,
    }
    span = _tracer.start_span(
        f"{run.workflow_class}.{step.step_name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    )
    try:
        with trace.use_span(span, end_on_exit=False):
            done = perform()
    except BaseException:
        span.end()  # use_span recorded the exception
        raise
    outcome = _outcome(done)
    settled_later = getattr(outcome, "when_settled", None)
    if settled_later is not None:  # an async def body, awaited elsewhere: the span ends when it does
        settled_later(partial(_end, span))
    else:
        _end(span, outcome)
    return done


def _end(span: Any, outcome: Any) -> None:
    """End an attempt's span with its outcome (None: no outcome of its own)."""
    span.set_attribute("pgbus_workflows.outcome", outcome.kind if outcome is not None else NO_OUTCOME)
    if outcome is not None and outcome.kind in ERROR_OUTCOMES:
        error = outcome.error
        if error is not None:
            span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}" if error else outcome.kind))
    span.end()


def _outcome(done: Any) -> Any:
    """The ``StepOutcome`` of what ``perform_step`` returned (None: the attempt parked or was gone)."""
    if isinstance(done, tuple):
        return done[1]
    return done
