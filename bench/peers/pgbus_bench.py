"""pgbus-workflows driven as the peers are, for ``bench.comparison``: the same three workloads, one shape.

The trickle is ``bench.trickle``'s (one dispatcher of concurrency 4, clients of
``bench.trickle_client``); the idle latency is ``bench.trickle``'s too, with the dispatcher's
footprint read before it stops; the crash kills a dispatcher (with the sweep, as deployed)
in the sleeping step of ``tests.testapp``'s ``Slow`` and starts another. The bench database
must exist and Django be set up (``bench.common.recreate_database``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from bench.common import ROOT, SETTLE_SECONDS, stop, wait_registered, wait_until
from bench.figures import Trickle
from bench.peers.processes import PEERS, crash_fact, footprint, kill_all, spawn

#: The dispatcher's concurrency: that of ``bench.trickle``'s first trickle, and the default.
CONCURRENCY = 4
DISPATCHER_LOG = PEERS / "pgbus-dispatcher.log"


def version() -> str:
    """This project's version, as installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("pgbus-workflows")
    except PackageNotFoundError:
        return "?"


class PgbusWorkflows:
    """This project's side of the comparison (no setup of its own: the bench database is made by the caller)."""

    def trickle(self, runs: int) -> Trickle:
        """``bench.trickle.trickle``: ``runs`` NoOp3 started by the client while one dispatcher of 4 drains them."""
        from bench.trickle import trickle

        return trickle(runs, 1, CONCURRENCY)

    def latency(self, samples: int) -> tuple[dict[str, list[float]], tuple[int, float]]:
        """``bench.trickle.latency_report``'s samples, one idle dispatcher of 4; its footprint before it stops."""
        from bench.common import start_dispatchers
        from bench.trickle import client

        [dispatcher] = start_dispatchers(1, CONCURRENCY)
        try:
            wait_registered(1)
            time.sleep(SETTLE_SECONDS)
            report: dict[str, list[float]] = client("latency", "--samples", str(samples))
            size = footprint(dispatcher.pid)
        finally:
            stop([dispatcher])
        return report, size

    def crash(self, seconds: float, bound: float) -> dict[str, Any]:
        """Kill the dispatcher in the sleeping step of a ``Slow`` run; what a new one does within ``bound`` s.

        ``Slow``'s first of two steps sleeps ``seconds`` (the peers' second of three does). Both
        dispatchers run with the sweep and every setting at its default, as deployed.
        """
        from django.db import connection

        from pgbus_workflows.models import WorkflowRun
        from tests.testapp.models import SideEffect
        from tests.testapp.workflows import Slow

        run = Slow.start(seconds=seconds).record
        starts = SideEffect.objects.filter(label="slow-start", key__startswith=f"{run.workflow_id}:")
        dispatcher = self.spawn_dispatcher()
        try:
            wait_until(starts.exists, 60, "the Slow run's sleeping step")
            time.sleep(1)
        finally:
            kill_all(dispatcher)
        restarted = time.time()
        dispatcher = self.spawn_dispatcher()
        try:
            finished = WorkflowRun.objects.filter(pk=run.pk, status="finished").values_list("finished_at", flat=True)
            deadline = time.monotonic() + bound
            while (done := finished.first()) is None and time.monotonic() < deadline:
                time.sleep(0.1)
            fact = crash_fact(starts.count(), done.timestamp() if done else None, restarted)
            fact["note"] = stall_note(run, restarted)
        finally:
            stop([dispatcher])
            connection.close()
        return fact

    def spawn_dispatcher(self) -> Any:
        """``manage.py run_workflow_dispatcher --concurrency 4`` with the sweep, in a session of its own."""
        command = [sys.executable, "-m", "django", "run_workflow_dispatcher", "-v", "0"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PGBUS_WORKFLOWS_JSON": json.dumps({})}
        return spawn([*command, "--concurrency", str(CONCURRENCY)], env, DISPATCHER_LOG, ROOT)


def stall_note(run: Any, restarted: float) -> str:
    """How the killed attempt was taken back: the run's ``step_stalled`` event (its detection and action), and when."""
    from pgbus_workflows.models import WorkflowEvent

    event = WorkflowEvent.objects.filter(run=run, kind="step_stalled").order_by("id").first()
    if event is None:
        return "no `step_stalled` event"
    details = event.details
    seconds = event.created_at.timestamp() - restarted
    return f"`step_stalled` ({details.get('detection')}, {details.get('action')}) {seconds:.1f} s after the start"
