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
from types import TracebackType
from typing import Any, Protocol

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


class Outcome(Protocol):
    """What an attempt's span reads of its ``StepOutcome``: the kind, and the error of an ``error`` or ``stall``."""

    @property
    def kind(self) -> str: ...  # noqa: D102 (the outcome's own)

    @property
    def error(self) -> BaseException | None: ...  # noqa: D102


class Settling(Protocol):
    """An ``async def`` body's attempt awaited elsewhere (``services.body.Awaiting``): it says when it ends."""

    def when_settled(self, callback: Callable[[Any], None]) -> None: ...  # noqa: D102


class AttemptSpan:
    """The span of one attempt while it runs (:func:`attempt_span`); told how the attempt ended.

    A context manager: the span is current inside it, and ends on the way out with the
    outcome it was told (:meth:`ended`), or when the outcome it awaits is settled
    (:meth:`settles_later`). An exception out of it ends the span recorded as an error.
    Without tracing it is a no-op.
    """

    __slots__ = ("_outcome", "_settling", "_span", "_using")

    def __init__(self, span: Any = None) -> None:
        self._span = span
        self._using: Any = None
        self._outcome: Outcome | None = None
        self._settling: Settling | None = None

    def ended(self, outcome: Outcome | None) -> None:
        """The attempt's outcome (None: it parked for a signal, or was no longer in progress)."""
        if self._span is not None:
            self._outcome = outcome

    def settles_later(self, settling: Settling) -> None:
        """The attempt's body goes on elsewhere: the span ends when ``settling`` is settled, with its outcome."""
        if self._span is not None:
            self._settling = settling

    def __enter__(self) -> AttemptSpan:
        if self._span is not None:
            self._using = trace.use_span(self._span, end_on_exit=False)
            self._using.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        span = self._span
        if span is None:
            return
        self._using.__exit__(kind, error, tb)  # records an exception on the span
        if kind is not None:
            span.end()
        elif self._settling is not None:
            self._settling.when_settled(partial(_end, span))
        else:
            _end(span, self._outcome)


#: The span of every attempt while tracing is off: nothing to record.
_UNTRACED = AttemptSpan()


def attempt_span(step: Any) -> AttemptSpan:
    """The span of an attempt of the claimed ``step``, to run the attempt in (``with attempt_span(step) as span:``).

    ``step`` is a :class:`~pgbus_workflows.models.WorkflowStep`, typed ``Any``: this module is
    in the layer below the models, and importing them, even for the annotation, would be an
    edge upwards.

    The span, named ``<workflow class>.<step>``, is a child of the context saved on the run
    (when there is one) and current while the attempt runs. Its attributes:
    ``pgbus_workflows.workflow_class``, ``.workflow_id``, ``.step``, ``.attempt`` and
    ``.outcome`` (the ``StepOutcome`` kind, or :data:`NO_OUTCOME`); an ``error`` or ``stall``
    outcome sets its status to error, with the exception recorded. When tracing is off it is
    a shared no-op.
    """
    if trace is None or isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
        return _UNTRACED
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
    return AttemptSpan(span)


def _end(span: Any, outcome: Outcome | None) -> None:
    """End an attempt's span with its outcome (None: no outcome of its own)."""
    span.set_attribute("pgbus_workflows.outcome", outcome.kind if outcome is not None else NO_OUTCOME)
    if outcome is not None and outcome.kind in ERROR_OUTCOMES:
        error = outcome.error
        if error is not None:
            span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}" if error else outcome.kind))
    span.end()
