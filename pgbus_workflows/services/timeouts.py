"""The sweep's phase of ``wait_timeout``: waiting steps past their deadline get their ``on_timeout``.

Each is re-checked under its run's lock (``services.locks``) and moved on by
``waiting.fire_timeout``, as ``expire_wait`` in the test helpers does.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..models import WorkflowStep
from ..sql import clock
from ..states import RunStatus, StepStatus
from . import waiting
from .isolation import RowFailures
from .locks import locked_step

BATCH_SIZE = 500
MAX_BATCHES = 20


def expire_due_waits(now: Any = None, failures: RowFailures | None = None) -> int:
    """The sweep phase: apply ``on_timeout`` to waiting steps of waiting runs past ``timeout_at``.

    At most ``BATCH_SIZE`` x ``MAX_BATCHES`` per sweep, each re-checked under the run lock,
    never waiting for a run another transaction holds; a row that fails is passed over
    (``failures``). A paused run's wait does not time out until it is resumed.
    """
    now = now or clock.now()
    failures = failures or RowFailures()
    fired = 0
    for _ in range(MAX_BATCHES):
        batch = list(
            WorkflowStep.objects.filter(status=StepStatus.WAITING, timeout_at__lt=now, run__status=RunStatus.WAITING)
            .exclude(pk__in=failures.passed_over("wait_timeouts"))
            .order_by("timeout_at", "pk")
            .values_list("pk", "run_id")[:BATCH_SIZE]
        )
        for step_pk, run_pk in batch:
            fired += failures.act("wait_timeouts", step_pk, run_pk, partial(_expire, step_pk, run_pk, now))
        if len(batch) < BATCH_SIZE:
            break
    return fired


def _expire(step_pk: int, run_pk: int, now: Any) -> bool:
    with locked_step(run_pk, step_pk, now=now, skip_locked=True) as (ledger, step):
        if ledger.run.status != RunStatus.WAITING or step is None or step.status != StepStatus.WAITING:
            return False
        if step.timeout_at is None or step.timeout_at >= now:
            return False
        waiting.fire_timeout(ledger, step)
        return True
