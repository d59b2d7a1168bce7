"""What the [otel] hooks cost: ``start()`` and an attempt, with tracing off, idle and on.

    .venv/bin/python -m bench.tracing [--calls 2000] [--rounds 5]

In one process, on its own database, the modes take turns round after round (each round
measures every mode once, in a new order), so the machine's drift falls on all of them:

- ``off``: ``pgbus_workflows.tracing`` as without opentelemetry-api installed (the baseline);
- ``idle``: the API with no span current at ``start()`` (and, for attempts, no tracer provider);
- ``on``: the SDK's provider, a span current at ``start()`` (the context saved on each run),
  and a span per attempt recorded by a processor that keeps nothing.

Each cell is the median over the rounds of the mean seconds a call, by the wall clock and by
this process's CPU clock (the hooks cost CPU; the wall clock adds the database's noise);
the ratios are to ``off``. The last rows time the two hooks alone, without the database.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from bench.common import drop_database, recreate_database

MODES = ("off", "idle", "on")


@contextmanager
def mode(name: str, sdk: Any) -> Iterator[None]:
    """Tracing as ``name`` says while the block runs."""
    from opentelemetry import trace

    from pgbus_workflows import tracing

    saved_module, saved_provider = tracing.trace, trace._TRACER_PROVIDER
    if name == "off":
        tracing.trace = None  # type: ignore[assignment] - the ImportError branch's value
    elif name == "idle":
        trace._TRACER_PROVIDER = None  # the global provider unset: a ProxyTracerProvider is returned
    else:
        trace._TRACER_PROVIDER = sdk
    span = sdk.get_tracer("bench").start_as_current_span("caller") if name == "on" else nullcontext()
    try:
        with span:
            yield
    finally:
        tracing.trace, trace._TRACER_PROVIDER = saved_module, saved_provider


def timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    """``(wall seconds, this process's CPU seconds, result)`` of ``call()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def start_calls(calls: int) -> int:
    from tests.testapp.workflows import NoOp1

    for _ in range(calls):
        NoOp1.start()
    return calls


def measure(calls: int, rounds: int) -> dict[tuple[str, str], dict[str, float]]:
    """``{(call, "wall" or "cpu"): {mode: seconds a call}}``, medians over the rounds."""
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    from pgbus_workflows.services.executor import run_due_steps

    sdk = TracerProvider()
    sdk.add_span_processor(SpanProcessor())  # records, exports nothing: the SDK's own cost
    seconds: dict[tuple[str, str], dict[str, list[float]]] = {
        (call, clock): {m: [] for m in MODES} for call in ("start", "attempt") for clock in ("wall", "cpu")
    }
    start_calls(100)  # warm: the connection, the statements' texts
    run_due_steps(limit=100)
    for _ in range(rounds):
        for name in random.sample(MODES, len(MODES)):
            with mode(name, sdk):
                for call, work in (("start", lambda: start_calls(calls)), ("attempt", lambda: run_due_steps(calls))):
                    wall, cpu, count = timed(work)
                    seconds[(call, "wall")][name].append(wall / count)
                    seconds[(call, "cpu")][name].append(cpu / count)
    hooks(sdk, seconds, rounds)
    return {key: {m: statistics.median(v) for m, v in cells.items()} for key, cells in seconds.items()}


def hooks(sdk: Any, seconds: dict[tuple[str, str], dict[str, list[float]]], rounds: int, calls: int = 20_000) -> None:
    """The hooks alone, without the database: ``carrier()`` and ``attempt_span()`` around nothing."""
    from pgbus_workflows import tracing
    from pgbus_workflows.models import WorkflowStep

    step = WorkflowStep.objects.select_related("run").order_by("pk").first()
    assert step is not None

    def attempt() -> None:
        with tracing.attempt_span(step) as span:
            span.ended(None)

    for call in ("carrier()", "attempt_span()"):
        seconds[(call, "cpu")] = {m: [] for m in MODES}
    for _ in range(rounds):
        for name in random.sample(MODES, len(MODES)):
            with mode(name, sdk):
                for call, work in (
                    ("carrier()", tracing.carrier),
                    ("attempt_span()", attempt),
                ):
                    _, cpu, _ = timed(lambda work=work: [work() for _ in range(calls)])
                    seconds[(call, "cpu")][name].append(cpu / calls)


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="start() calls (and attempts) per mode and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    recreate_database()
    try:
        figures = measure(args.calls, args.rounds)
    finally:
        drop_database()
    print("| call | clock | off (µs) | idle (µs) | on (µs) | idle / off | on / off |")
    print("|---|---|---|---|---|---|---|")
    for (call, clock), cells in figures.items():
        off, idle, on = (cells[m] for m in MODES)
        print(
            f"| {call} | {clock} | {off * 1e6:.1f} | {idle * 1e6:.1f} | {on * 1e6:.1f} "
            f"| {idle / off:.3f} | {on / off:.3f} |"
        )


if __name__ == "__main__":
    main()
