"""A checkpoint's attempt under its own options: routed, limited and timed as it says; atomic; raised.

The row a function runs on was claimed before the function knew which checkpoint came next
(the :data:`ENTRY` row, under the class's queue, priority and limits). :func:`take` makes it
the checkpoint's attempt: when the checkpoint's queue, priority or limiters differ from the
row's, the row goes back to be claimed under the checkpoint's own (``step_rerouted``): its
slots are given back, it is due now in the checkpoint's queue with its priority and limiters,
and the claim that takes it runs the function again, which replays to the checkpoint and runs
its body on that row. A ``timeout=`` of its own is the attempt's, from then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from ..conf import settings
from ..dsl.definitions import StepDefinition, resolve_policy
from ..dsl.limits import declared_limits, step_limits
from ..models import WorkflowStep
from ..services import limiting
from ..services.handle import RunHandle, attempt_route
from ..services.locks import locked_step
from ..services.outcome import consecutive_error_reattempts
from ..states import RunStatus, StepStatus


def take(step: WorkflowStep, name: str, definition: StepDefinition | None, attempt: int = 1) -> WorkflowStep | None:
    """The in-progress row ``step`` as checkpoint ``name``'s attempt under ``definition``; None: the function stops.

    A row carrying the function on (another name) is renamed to the checkpoint's ``attempt``
    (the first, or the next after a rewind's superseded ones). None when the row is no longer
    in progress, or when it went back to be claimed under the checkpoint's queue, priority or
    limits (see the module).
    """
    renaming = step.step_name != name
    if not renaming and (definition is None or fits(step, definition)):
        return step
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is None or locked.status != StepStatus.IN_PROGRESS:
            return None
        fields = []
        if renaming:
            locked.step_name, locked.attempt = name, attempt
            fields += ["step_name", "attempt"]
            ledger.set_run(current_step=name)
        locked.run = ledger.run
        if definition is not None:
            queue, priority = attempt_route(ledger.cls, definition, ledger.run)
            limiters = limiting.bind(ledger.cls, definition, ledger.run, ledger.now, held=locked.limiters or ())
            if (queue, priority, limiters or None) != (locked.queue, locked.priority, locked.limiters or None):
                _reroute(ledger, locked, definition, queue, priority, limiters)
                return None
            if locked.timeout != definition.timeout:
                locked.timeout = definition.timeout
                locked.stall_at = ledger.now + (definition.timeout or settings.STALL_THRESHOLD)
                fields += ["timeout", "stall_at"]
        if fields:
            locked.save(update_fields=fields)
        return locked


def fits(step: WorkflowStep, definition: StepDefinition) -> bool:
    """True when the claimed ``step`` already has the queue, priority, limiters and timeout ``definition`` gives.

    Such a row runs the checkpoint's body as it is: no write before the body (``ctx`` renames
    the function's row with the checkpoint's outcome).
    """
    cls: type[RunHandle] = _class(step)
    queue, priority = attempt_route(cls, definition, step.run)
    names = None
    if declared_limits(cls, definition):
        names = [limit.name for limit in step_limits(cls, definition, lambda: cls(step.run))]
    wanted = (queue, priority, names or None, definition.timeout)
    return wanted == (step.queue, step.priority, step.limiters or None, step.timeout)


def _class(step: WorkflowStep) -> type[RunHandle]:
    from ..services.handle import handle_class

    return handle_class(step.run.workflow_class)


def _reroute(
    ledger: Any,
    step: WorkflowStep,
    definition: StepDefinition,
    queue: str,
    priority: int,
    limiters: list[str] | None,
) -> None:
    """Send the claimed ``step`` back, due now, under ``definition``'s route and limiters (slots given back)."""
    before = {"queue": step.queue, "priority": step.priority, "limiters": step.limiters or []}
    ledger.move_step(
        step,
        "unclaim",
        step_name=step.step_name,
        attempt=step.attempt,
        started_at=None,
        claimed_by="",
        stall_at=None,
        scheduled_at=ledger.now,
        queue=queue,
        priority=priority,
        limiters=limiters,
        timeout=definition.timeout,
    )
    details = {"from": before, "to": {"queue": queue, "priority": priority, "limiters": limiters or []}}
    if ledger.run.status == RunStatus.PERFORMING:
        ledger.transition("advance", RunStatus.READY, kind="step_rerouted", step=step, details=details)
    else:
        ledger.event("step_rerouted", step=step, details=details)
    ledger.wake(queue)


def gives_up_raising(
    cls: type[RunHandle], definition: StepDefinition | None, error: BaseException, step: WorkflowStep
) -> bool:
    """True when ``error`` of checkpoint attempt ``step`` is raised into the function now.

    Its policy (the checkpoint's, the class's) says ``action="raise"``, or reattempts with
    ``terminal_action="raise"`` and has no reattempt left.
    """
    policy = resolve_policy(cls, definition, error)
    if policy.action == "raise":
        return True
    if policy.action != "reattempt" or policy.terminal_action != "raise" or policy.max_reattempts is None:
        return False
    return consecutive_error_reattempts(step) >= policy.max_reattempts


class Gone(Exception):
    """The attempt was no longer in progress when its atomic body's output was to be recorded."""


def atomic(
    step: WorkflowStep, body: Callable[[], Any], record: Callable[[WorkflowStep, Any], WorkflowStep | None]
) -> tuple[WorkflowStep | None, Any]:
    """Run ``body`` and ``record`` its output in one transaction: ``(row carrying on, output)``.

    The body's ORM writes commit with the checkpoint's outcome or not at all: an error rolls
    them back (and goes to the policy); an attempt no longer in progress (stalled past its
    timeout, cancelled), for which ``record`` raises :class:`Gone`, rolls them back and
    returns ``(None, None)``.
    """
    try:
        with transaction.atomic():
            output = body()
            following = record(step, output)
    except Gone:
        return None, None
    return following, output
