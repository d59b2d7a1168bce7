"""The write tools: the admin's verbs on one run, each with the reason the assistant gives.

Offered only with ``PGBUS_WORKFLOWS["MCP_WRITE_TOOLS"] = True``. Each calls
:func:`~pgbus_workflows.operating.operators.operate` with the admin's
:data:`~pgbus_workflows.admin.operations.OPERATIONS`, exactly as ``manage.py workflows`` does:
the same permission check (with ``--as-user``), the same verb under the run's lock, the same
audit event, whose actor is the operator's and whose reason is the one given. A verb the
run's state or the operator's permissions refuse is a tool error with the refusal's message,
and changes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

from django.core.management.base import CommandError
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, StringConstraints

from ..admin.operations import OPERATIONS
from ..exceptions import PayloadNotSerializable, PayloadTooLarge
from ..operating.holds import run_hold_command
from ..operating.operators import Operator, operate
from ..services.payload import encode_payload
from ..services.signals import check_signal_input
from .arguments import Name, Reason, RunId

#: The step ``resume_at`` resumes at.
StepName = Annotated[Name, Field(description="The step to resume at: one of the run's class's steps.")]
#: The step a fork starts at.
FromStep = Annotated[
    Name,
    Field(
        description="The step the fork starts at: one of the run's class's steps, or a checkpoint a durable "
        "function's run reached (the steps before it are kept)."
    ),
]
#: A signal's name.
SignalName = Annotated[Name, Field(description="The signal's name: one a step of the run's class waits for.")]
#: A signal's payload, checked by ``encode_payload`` as the admin's form checks it.
Payload = Annotated[Any, Field(description="The signal's payload: any JSON value (null when none).")]
#: What a hold names: a workflow class or a queue.
HoldClass = Annotated[Name | None, Field(description="A registered workflow class's name (or give queue).")]
HoldQueue = Annotated[Name | None, Field(description="A queue's name (or give workflow_class).")]
#: A signal's idempotency key.
IdempotencyKey = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1),
    Field(description="A repeat of the signal with this key changes nothing."),
]


def take(operator: Operator, verb: str, workflow_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """Take the admin's ``verb`` on one run: what it did, or a tool error saying why it was refused."""
    [result] = operate(operator, OPERATIONS[verb], [workflow_id], data)
    if not result.ok:
        raise ToolError(f"{result.run}: refused: {result.message}")
    return result.as_dict()


def pause_run(operator: Operator, workflow_id: RunId, reason: Reason) -> dict[str, Any]:
    """Pause a run: a step already running finishes, nothing new starts until it is resumed."""
    return take(operator, "pause", workflow_id, {"reason": reason})


def resume_run(operator: Operator, workflow_id: RunId, reason: Reason) -> dict[str, Any]:
    """Resume a paused run where it stopped (a step that failed is attempted again)."""
    return take(operator, "resume", workflow_id, {"reason": reason})


def resume_at(operator: Operator, workflow_id: RunId, step: StepName, reason: Reason) -> dict[str, Any]:
    """Resume a paused run at the given step, now (steps before it are not run again; needs the skip permission)."""
    return take(operator, "resume_at", workflow_id, {"reason": reason, "step": step})


def cancel_run(operator: Operator, workflow_id: RunId, reason: Reason) -> dict[str, Any]:
    """Cancel an ongoing run for good: no further step runs (a running step's result is not used)."""
    return take(operator, "cancel", workflow_id, {"reason": reason})


def skip_step(operator: Operator, workflow_id: RunId, reason: Reason) -> dict[str, Any]:
    """Skip the run's current step: the run goes on with the next step as if this one had done nothing."""
    return take(operator, "skip", workflow_id, {"reason": reason})


def run_now(operator: Operator, workflow_id: RunId, reason: Reason) -> dict[str, Any]:
    """Make the run's scheduled step due now, cutting its wait short (or end a wait for a signal)."""
    return take(operator, "run_now", workflow_id, {"reason": reason})


def signal_run(
    operator: Operator,
    workflow_id: RunId,
    name: SignalName,
    reason: Reason,
    payload: Payload = None,
    idempotency_key: IdempotencyKey | None = None,
) -> dict[str, Any]:
    """Deliver a named signal, with a JSON payload, to a run (as the application's own code would)."""
    try:
        check_signal_input(name, idempotency_key, operator.actor)
        payload = encode_payload(payload, "payload")
    except (ValueError, PayloadNotSerializable, PayloadTooLarge) as error:
        raise ToolError(str(error)) from None
    data = {"reason": reason, "name": name, "payload": payload, "idempotency_key": idempotency_key}
    return take(operator, "signal", workflow_id, data)


def fork_run(
    operator: Operator, workflow_id: RunId, reason: Reason, from_step: FromStep | None = None
) -> dict[str, Any]:
    """Start a new run of a run's class, subject and arguments at a step (the first when none is given).

    The steps before it are not run again: the new run keeps this run's outputs for them. The
    answer's ``new_run`` is the fork's id. Needs the rerun permission.
    """
    return take(operator, "fork", workflow_id, {"reason": reason, "from_step": from_step})


def _hold_command(
    operator: Operator, subcommand: str, workflow_class: str | None, queue: str | None, reason: str
) -> dict[str, Any]:
    if (workflow_class is None) == (queue is None):
        raise ToolError("give one of workflow_class and queue")
    options = {"subcommand": subcommand, "workflow_class": workflow_class, "queue": queue, "reason": reason}
    try:
        document = run_hold_command(operator, options)[1]
    except CommandError as error:
        raise ToolError(str(error)) from None
    assert isinstance(document, dict)  # noqa: S101 - hold and release answer one object
    return document


def hold(
    operator: Operator, reason: Reason, workflow_class: HoldClass = None, queue: HoldQueue = None
) -> dict[str, Any]:
    """Hold a workflow class or a queue: none of its steps is claimed until released (runs keep their status).

    For when a service its steps call is down. Holding what is held already keeps that hold.
    """
    return _hold_command(operator, "hold", workflow_class, queue, reason)


def release(
    operator: Operator, reason: Reason, workflow_class: HoldClass = None, queue: HoldQueue = None
) -> dict[str, Any]:
    """Release the hold of a workflow class or a queue: its due steps are claimed in due order."""
    return _hold_command(operator, "release", workflow_class, queue, reason)
