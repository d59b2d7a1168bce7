"""The client side of ``bench.trickle``: a process that calls ``start()`` as a web tier would.

    python -m bench.trickle_client trickle --runs 2000   # NoOp3.start() back to back
    python -m bench.trickle_client trickle --runs 2000 --workflow durable_noop3  # another class's
    python -m bench.trickle_client latency --samples 200 # Probe.start(), wait for it, 10 ms pause
    python -m bench.trickle_client cost --calls 500      # NoOp3.start() with no dispatcher running
    python -m bench.trickle_client many --runs 10000     # NoOp3.start_many(), three times

Each call is its own transaction (autocommit, no outer ``atomic``), on the bench database
(the parent's ``DATABASE_URL``). Before measuring, the connection is opened and one start is
made and rolled back, as a warm web process would have done already (imports, the server's
clock, prepared statements). Prints one JSON document: raw seconds, which the parent turns
into rates and percentiles.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from typing import Any

import bench.common  # noqa: F401 - points Django at the bench database
from bench.calls import back_to_back


def warm_up() -> None:
    """Connect and make one start that is rolled back: nothing is left, nothing is notified."""
    import django

    django.setup()
    from django.db import transaction

    from tests.testapp.workflows import NoOp3

    with transaction.atomic():
        NoOp3.start()
        transaction.set_rollback(True)


def trickle(runs: int, workflow: str = "noop3") -> dict[str, Any]:
    """``runs`` starts of the class registered as ``workflow`` back to back (:func:`bench.calls.back_to_back`)."""
    from pgbus_workflows.dsl.declared import registry

    cls = registry.get(workflow)
    if cls is None:
        raise SystemExit(f"no workflow class registered as {workflow!r}")
    return back_to_back(cls.start, runs)


def latency(samples: int, pause: float = 0.01, poll: float = 0.002) -> dict[str, Any]:
    """Seconds from just before ``Probe.start()`` to the first line of its body (its output says when).

    Also, per sample, the seconds from the call to its return (committed) and to the claim
    (the attempt's ``started_at``, the dispatcher's reading of the server's clock). One
    sample at a time: the next starts ``pause`` seconds after the previous one's outcome is
    committed (polled every ``poll`` seconds; the poll does not enter the figures).
    """
    from tests.testapp.workflows import Probe

    report: dict[str, list[float]] = {"latency": [], "returned": [], "claimed": []}
    for _ in range(samples):
        called = time.time()
        wf = Probe.start()
        returned = time.time()
        step = completed_step(wf.record, poll)
        report["latency"].append(step["output"]["body_at"] - called)
        report["returned"].append(returned - called)
        report["claimed"].append(step["started_at"].timestamp() - called)
        time.sleep(pause)
    return report


def completed_step(run: Any, poll: float, timeout: float = 30) -> Mapping[str, Any]:
    """The completed attempt of ``run``'s one step (its output and ``started_at``), polled for."""
    from pgbus_workflows.models import WorkflowStep

    done = WorkflowStep.objects.filter(run=run, status="completed").values("output", "started_at")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step = done.first()
        if step is not None:
            return step
        time.sleep(poll)
    raise TimeoutError(f"run {run.workflow_id} did not finish in {timeout:.0f} s")


def cost(calls: int) -> dict[str, Any]:
    """Each call's wall and CPU seconds; the executes Django's cursors made, and their statements by verb.

    ``connection.execute_wrapper`` sees every execute the engine makes (its SQL goes through
    Django cursors, pipelined ones included), not the BEGIN and COMMIT psycopg sends itself.
    One execute may hold several statements joined by "; " (``sql.run_batch``): one round trip.
    """
    from django.db import connection

    from tests.testapp.workflows import NoOp3

    executes = 0
    statements: dict[str, int] = {}

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal executes
        executes += 1
        for statement in sql.split("; "):
            verb = statement.split(None, 1)[0].upper()
            statements[verb] = statements.get(verb, 0) + 1
        return execute(sql, params, many, context)

    walls, cpus = [], []
    with connection.execute_wrapper(count):
        for _ in range(calls):
            wall, cpu = time.perf_counter(), time.process_time()
            NoOp3.start()
            cpus.append(time.process_time() - cpu)
            walls.append(time.perf_counter() - wall)
    return {"wall": walls, "cpu": cpus, "executes": executes, "statements": statements}


def many(runs: int, repeat: int = 3) -> dict[str, Any]:
    """The wall and CPU seconds of ``repeat`` ``start_many()`` calls of ``runs`` items each (an import)."""
    from tests.testapp.workflows import NoOp3

    walls, cpus = [], []
    for number in range(repeat):
        items = [{"arguments": {"row": n}, "idempotency_key": f"import-{number}-{n}"} for n in range(runs)]
        wall, cpu = time.perf_counter(), time.process_time()
        NoOp3.start_many(items)
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return {"runs": runs, "wall": walls, "cpu": cpus}


def main() -> None:
    """Parse the mode, warm up, measure, print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__)
    modes = parser.add_subparsers(dest="mode", required=True)
    trickling = modes.add_parser("trickle")
    trickling.add_argument("--runs", type=int, default=2000)
    trickling.add_argument("--workflow", default="noop3", help="the registered name of the class started")
    modes.add_parser("latency").add_argument("--samples", type=int, default=200)
    modes.add_parser("cost").add_argument("--calls", type=int, default=500)
    modes.add_parser("many").add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    warm_up()
    if args.mode == "trickle":
        result = trickle(args.runs, args.workflow)
    elif args.mode == "latency":
        result = latency(args.samples)
    elif args.mode == "many":
        result = many(args.runs)
    else:
        result = cost(args.calls)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
