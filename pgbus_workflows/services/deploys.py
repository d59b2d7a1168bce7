"""The sweep's deploy phases: steps that no live code can run, and runs parked on gravestones.

- ``unknown_steps``: a due step that no live dispatcher's code knows (by each dispatcher's
  ``catalog``, and this process's own) for longer than ``UNKNOWN_STEP_GRACE`` pauses its run
  with ``StepNotDefined`` recorded. The step stays scheduled, unrun: deploy the code that
  defines it and resume the run, and it runs with its attempt (and any signal) intact.
- ``gravestones``: a run waiting in a step that the code has since replaced by
  ``removed_step()`` moves on to the next step now (its wait would otherwise time out).
- ``stray_holds``: a scheduled attempt still held (``WorkflowStep.held``) while its run is
  no longer paused, as code older than the flag leaves it when it resumes a run that newer
  code paused, is released: claims pass held attempts over.

Each row is re-checked under the run lock and never waits for a run another transaction holds.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial

from django.db.models import Count

from .. import sql
from ..conf import settings
from ..dsl.declared import DeclaredWorkflow, registry
from ..dsl.deploy import catalog, knows_step
from ..models import Dispatcher, WorkflowRun, WorkflowStep
from ..states import RunStatus, StepStatus
from . import waiting
from .isolation import RowFailures
from .ledger import SYSTEM_ACTOR
from .locks import locked_step
from .outcome import StepOutcome

BATCH_SIZE = 500


def live_catalog(now: datetime) -> dict[str, set[str]]:
    """``{class: step names}`` that some live dispatcher (or this process) can run."""
    known: dict[str, set[str]] = {name: set(steps) for name, steps in catalog().items()}
    alive = Dispatcher.objects.filter(heartbeat_at__gte=now - settings.DISPATCHER_DEAD_AFTER)
    for entry in alive.values_list("catalog", flat=True):
        for name, steps in (entry or {}).items():
            known.setdefault(name, set()).update(steps)
    return known


#: The most overdue attempts one sweep looks at for steps no live code knows (oldest first).
SCAN_LIMIT = 5000


def pause_unknown_steps(now: datetime, failures: RowFailures | None = None) -> int:
    """Pause the runs whose step was due ``UNKNOWN_STEP_GRACE`` ago and that no live code can run.

    The known (class, step) pairs are matched here, not in SQL: a condition per class made
    the query's planning grow with the classes (two seconds a sweep at 200 classes). Overdue
    attempts are rare; behind a backlog of more than ``SCAN_LIMIT`` known ones, an unknown
    one waits for a later sweep.
    """
    failures = failures or RowFailures()
    known = live_catalog(now)
    grace = settings.UNKNOWN_STEP_GRACE
    overdue = (
        WorkflowStep.objects.filter(
            status=StepStatus.SCHEDULED, held=False, scheduled_at__lt=now - grace, run__status=RunStatus.READY
        )
        .exclude(pk__in=failures.passed_over("unknown_steps"))
        .order_by("scheduled_at", "pk")
        .values_list("pk", "run_id", "run__workflow_class", "step_name")[:SCAN_LIMIT]
    )
    rows = [(pk, run_pk) for pk, run_pk, name, step in overdue if not knows_step(known.get(name, ()), step)][
        :BATCH_SIZE
    ]
    return sum(
        failures.act("unknown_steps", step_pk, run_pk, partial(_pause_unknown, step_pk, run_pk, now, known))
        for step_pk, run_pk in rows
    )


def _pause_unknown(step_pk: int, run_pk: int, now: datetime, known: dict[str, set[str]]) -> bool:
    with locked_step(run_pk, step_pk, now=now, skip_locked=True) as (ledger, step):
        run = ledger.run
        if run.status != RunStatus.READY or step is None or step.status != StepStatus.SCHEDULED:
            return False
        if knows_step(known.get(run.workflow_class, ()), step.step_name):
            return False
        grace = settings.UNKNOWN_STEP_GRACE
        where = "class" if run.workflow_class not in known else "step"
        reason = (
            f"StepNotDefined: no live dispatcher's code defines the {where} of step {step.step_name!r} of "
            f"{run.workflow_class} (due since {step.scheduled_at.isoformat()}, UNKNOWN_STEP_GRACE "
            f"{grace.total_seconds():.0f}s): deploy the code that defines it to the dispatchers, then resume the run"
        )
        details = {
            "error_class": "pgbus_workflows.exceptions.StepNotDefined",
            "unknown": where,
            "step": step.step_name,
            "grace_seconds": grace.total_seconds(),
        }
        ledger.transition(
            "pause", RunStatus.PAUSED, kind="paused", step=step, actor=SYSTEM_ACTOR, reason=reason, details=details
        )
        ledger.set_run(paused_reason=reason[:2000])
        return True


def release_stray_holds(now: datetime, failures: RowFailures | None = None) -> int:
    """Release the held attempts of runs that are not paused (at most ``BATCH_SIZE`` a sweep)."""
    failures = failures or RowFailures()
    passed_over = set(failures.passed_over("stray_holds"))
    if sql.postgresql():
        with sql.cursor() as cursor:
            cursor.execute(sql.statement("stray_holds"), [BATCH_SIZE + len(passed_over)] * 2)
            held = cursor.fetchall()
    else:
        held = list(
            WorkflowStep.objects.filter(status=StepStatus.SCHEDULED, held=True)
            .exclude(run__status=RunStatus.PAUSED)
            .values_list("pk", "run_id")[: BATCH_SIZE + len(passed_over)]
        )
    rows = [(step_pk, run_pk) for step_pk, run_pk in held if step_pk not in passed_over][:BATCH_SIZE]
    return sum(
        failures.act("stray_holds", step_pk, run_pk, partial(_release_hold, step_pk, run_pk, now))
        for step_pk, run_pk in rows
    )


def _release_hold(step_pk: int, run_pk: int, now: datetime) -> bool:
    with locked_step(run_pk, step_pk, now=now, skip_locked=True) as (ledger, step):
        run = ledger.run
        if run.status == RunStatus.PAUSED or step is None or step.status != StepStatus.SCHEDULED or not step.held:
            return False
        ledger.release_hold(step)
        return True


def skip_parked_gravestones(now: datetime, failures: RowFailures | None = None) -> int:
    """Move on the waiting runs parked in a step that this code has made a ``removed_step()``."""
    failures = failures or RowFailures()
    moved = 0
    for cls in registry.classes():
        names = cls.removed_step_names()
        if not names:
            continue
        rows = (
            WorkflowStep.objects.filter(
                status=StepStatus.WAITING,
                fan_out_total__isnull=True,
                step_name__in=names,
                run__workflow_class=cls.name,
                run__status=RunStatus.WAITING,
            )
            .exclude(pk__in=failures.passed_over("gravestones"))
            .order_by("pk")
            .values_list("pk", "run_id")[:BATCH_SIZE]
        )
        for step_pk, run_pk in rows:
            moved += failures.act("gravestones", step_pk, run_pk, partial(_skip_gravestone, step_pk, run_pk, now))
    return moved


def _skip_gravestone(step_pk: int, run_pk: int, now: datetime) -> bool:
    with locked_step(run_pk, step_pk, now=now, skip_locked=True) as (ledger, step):
        if ledger.run.status != RunStatus.WAITING or step is None or step.status != StepStatus.WAITING:
            return False
        definition = ledger.cls.step_definition(step.step_name)
        if definition is None or not definition.removed:
            return False
        outcome = StepOutcome("skip", reason="removed step", details={"removed": True}, body_ran=False)
        waiting.resolve(ledger, step, outcome)
        return True


def removed_steps_in_flight(cls: type[DeclaredWorkflow]) -> dict[str, int]:
    """``{removed step name: ongoing runs of cls still on it}`` (``Workflow.removed_steps_in_flight``)."""
    names = cls.removed_step_names()
    if not names:
        return {}
    rows = (
        WorkflowRun.objects.ongoing()
        .filter(workflow_class=cls.name, current_step__in=names)
        .values("current_step")
        .annotate(n=Count("pk"))
    )
    counts = {row["current_step"]: row["n"] for row in rows}
    return {name: counts.get(name, 0) for name in names}
