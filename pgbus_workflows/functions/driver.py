"""The driver: the body of every row of a durable class of a plain ``def``, which runs the function from the top.

It opens the ``ctx`` of the attempt in hand (``context.DurableContext``) with the run's recorded
checkpoints, calls the function, and turns how it ended into the attempt's outcome: its
return, an error for the engine's policies, nothing left to apply, or the new checkpoint the
call ended at, to be written with other outcomes (``services.checkpoint_end``). The async
driver (``async_context``) ends its coroutine the same way.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..exceptions import NonDeterministicRun
from ..services.context import FlowControl, StepContext
from ..services.payload import encode_payload
from .context import DurableContext, Stopped
from .names import ENTRY


def drive(workflow: Any) -> Any:
    """The body of every row of a durable class of a plain ``def``: run the function from the top, replaying.

    Its return finishes the run with that result. An error to apply (a checkpoint's, the
    function's own) is raised for the engine's policies; nothing to apply is marked on the
    step context (``applied``).
    """
    ctx = open_context(workflow)
    try:
        value = type(workflow).function(ctx, **workflow.arguments)
    except Stopped as stopped:
        return stopped_at(workflow, ctx._context, stopped)
    except BaseException:
        if ctx._pending is None:
            raise
        try:  # the function's own error, past a checkpoint still to record: recorded first, as it went
            ctx.record_pending()
        except Stopped as stopped:
            return stopped_at(workflow, ctx._context, stopped)
        raise
    return returned(workflow, ctx, value)


def open_context(workflow: Any) -> DurableContext:
    """The ``ctx`` of the attempt in hand, with the run's recorded checkpoints.

    One query; none for a row claimed by the transaction that recorded the last of them,
    which handed them over (``services.checkpoint_end``), nor for the run's first row, made
    with the run (a fork's copies are made with it too: a fork always reads).
    """
    from . import checkpoints  # deferred: the package root loads this module before the app registry

    context: StepContext = workflow._context
    step, run = context.step, workflow.record
    carried = step.carried
    if isinstance(carried, checkpoints.Replay):
        replay = checkpoints.Replay(list(carried), dict(carried.attempts))  # the function appends to its own
    elif step.created_at == run.created_at and run.forked_from is None:
        replay = checkpoints.Replay([], {})
    else:
        replay = checkpoints.recorded(run.pk, step.pk)
    return DurableContext(workflow, context, checkpoints, replay)


def stopped_at(workflow: Any, context: StepContext, stopped: Stopped) -> None:
    """The function stopped: the outcome it ends with, its error for the engine's policies, or nothing to apply."""
    workflow._context = context
    if stopped.outcome is not None:
        raise FlowControl("outcome", value=stopped.outcome)
    if stopped.error is None:
        context.applied = True
        return None
    raise stopped.error from None


def returned(workflow: Any, ctx: DurableContext, value: Any) -> NoReturn:
    """The function returned ``value``: the run finishes with it (raised as the engine's ``finished``).

    A checkpoint still to record finishes the run in its own write, the result encoded here
    (one that cannot be is left to the next call, whose row records the error).
    """
    context = workflow._context = ctx._context
    if ctx._pending is not None:
        try:
            result = None if value is None else encode_payload(value, f"{ENTRY} result")
        except Exception:
            raise FlowControl("outcome", value=ctx.ended_at_checkpoint()) from None
        raise FlowControl("outcome", value=ctx.ended_at_checkpoint(result, finished=True))
    if context.step.step_name != ENTRY:
        raise NonDeterministicRun(
            f"The function returned where the run was due at checkpoint {context.step.step_name!r}"
        )
    raise FlowControl("finished", value=value)
