"""The chaos harness's optional schedule (``--schedule``): an every-second schedule fires throughout.

Its policies are ``overlap="allow"`` and ``catchup="all"``, so the promise is exact: every tick
from the first to the last has exactly one run, whichever dispatcher led when it came and
however many leaders were SIGKILLed, and every one of those runs finished.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

SECOND = timedelta(seconds=1)


def add() -> Any:
    """Add the schedule (a ``Ticked`` run per second); returns its row."""
    from pgbus_workflows.sql import clock
    from tests.testapp.workflows import Ticked

    return Ticked.add_schedule(every=SECOND, name="chaos every second", overlap="allow", catchup="all",
                               start_at=clock.now())  # fmt: skip


def settle(schedule: Any, timeout: float) -> None:
    """Pause the schedule (no new tick), then wait for its runs to end while dispatchers still serve."""
    from pgbus_workflows.models import WorkflowRun
    from pgbus_workflows.services import schedules

    schedules.pause(schedule.pk, actor="chaos", reason="the harness is done")
    deadline = time.monotonic() + timeout
    while WorkflowRun.objects.ongoing().filter(schedule=schedule).exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def check(schedule: Any, violations: list[str]) -> int:
    """Each tick once, none lost, every run finished; returns how many ticks fired."""
    from pgbus_workflows.models import WorkflowRun

    runs = list(WorkflowRun.objects.filter(schedule=schedule).order_by("scheduled_for"))
    ticks = [run.scheduled_for for run in runs]
    if not ticks:
        violations.append("the schedule fired no tick")
        return 0
    if len(set(ticks)) != len(ticks):
        violations.append("a tick of the schedule has two runs")
    span = int((ticks[-1] - ticks[0]) / SECOND)
    missing = sorted({ticks[0] + n * SECOND for n in range(span + 1)} - set(ticks))
    if missing:
        violations.append(f"{len(missing)} tick(s) lost between {ticks[0]} and {ticks[-1]}: {missing[:10]}")
    unfinished = [str(run.workflow_id) for run in runs if run.status != "finished"]
    if unfinished:
        violations.append(f"{len(unfinished)} scheduled run(s) did not finish: {unfinished[:10]}")
    return len(ticks)
