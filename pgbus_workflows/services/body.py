"""Calling a step body: its return, verb or exception becomes exactly one :class:`StepOutcome`.

Also the log line of an attempt that failed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.db import connection

from ..dsl.jobs import Child, Job
from ..exceptions import StepNotDefined
from ..models import WorkflowRun, WorkflowStep
from .children import ChildStart, check_depth, child_key
from .context import FlowControl, StepContext
from .outcome import StepOutcome
from .payload import encode_payload
from .start import check_start
from .transactions import CONNECTION_ERRORS

if TYPE_CHECKING:
    from .handle import RunHandle

logger = logging.getLogger("pgbus_workflows")


def run_body(workflow: RunHandle, context: StepContext) -> StepOutcome:
    """Call the step body with the step context set; never raises."""
    step = context.step
    definition = type(workflow).step_definition(step.step_name)
    if definition is None or definition.func is None:  # the guards ruled this out
        raise StepNotDefined(step.step_name)
    workflow._context = context
    context.fan_out = definition.kind == "fan_out"
    try:
        try:
            value = definition.func(workflow)
            if inspect.isawaitable(value):
                value = awaited(workflow, value, definition.timeout)
        except FlowControl as flow:
            if flow.kind == "finished":
                return StepOutcome("finished", output=_encoded(flow.value, f"{step.step_name} result"))
            if flow.kind != "output":
                return StepOutcome(flow.kind, wait=flow.wait, reason=flow.reason)
            value = flow.value
        if definition.kind == "fan_out":
            return _fan_out(workflow, step.step_name, value, context)
        return StepOutcome("success", output=_encoded(value, f"{step.step_name} output"))
    except FlowControl as flow:  # a verb called while encoding the output (a custom encoder)
        return StepOutcome(flow.kind, wait=flow.wait, reason=flow.reason)
    except BodyTimedOut as timed_out:  # the coroutine was cancelled: the attempt stalls, as a hung one would
        return StepOutcome("stall", error=timed_out, details={"detection": "timeout"})
    except BaseException as error:
        # SystemExit, KeyboardInterrupt, GeneratorExit, CancelledError too: a body ends in one
        # recorded outcome whatever it raises, and the worker thread lives on.
        if isinstance(error, CONNECTION_ERRORS) and (connection.connection is None or not connection.is_usable()):
            # The database went away under the body (a restart, a failover): not the body's
            # fault, so not its policy's: the attempt stalls, as on a crash (STALL_ACTION).
            return StepOutcome("stall", error=error)
        return StepOutcome.from_error(error)
    finally:
        workflow._context = None


class BodyTimedOut(Exception):
    """An ``async def`` body ran past its step's ``timeout=``: it was cancelled."""


def awaited(workflow: RunHandle | None, coroutine: Awaitable[Any], timeout: timedelta | None = None) -> Any:
    """An ``async def`` body's (or job's) value: awaited on an event loop of this worker thread's own.

    What ``self`` reads from the database (the subject, the outputs) is read first: inside the
    coroutine Django refuses a query that is not awaited. Its awaited ORM calls run on this
    thread, with its connection (asgiref hands them back to it). Past ``timeout`` the
    coroutine is cancelled and :class:`BodyTimedOut` raised (a ``TimeoutError`` of its own
    goes to its policy as any error).
    """
    if workflow is not None:
        for name in ("subject", "outputs"):
            getattr(workflow, name, None)

    async def wait() -> Any:
        if timeout is None:
            return await coroutine
        try:
            async with asyncio.timeout(timeout.total_seconds()) as deadline:
                return await coroutine
        except TimeoutError:
            if deadline.expired():
                raise BodyTimedOut(f"cancelled after its timeout of {timeout}") from None
            raise

    return async_to_sync(wait)()


def _encoded(value: Any, what: str) -> Any:
    return None if value is None else encode_payload(value, what)


def _fan_out(workflow: RunHandle, step_name: str, value: Any, context: StepContext) -> StepOutcome:
    """A fan-out body's return value as stored jobs or checked children, with the output it kept."""
    if value is None or isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
        raise TypeError(
            f"fan-out step {step_name} must return an iterable of Job or of Child, got {type(value).__name__}"
        )
    members = list(value)
    output = _encoded(context.kept_output, f"{step_name} output")
    if members and all(isinstance(member, Child) for member in members):
        check_depth(workflow.record)
        children = [
            ChildStart(
                child.workflow_class,
                check_start(
                    child.workflow_class,
                    child.subject,
                    child.idempotency_key or child_key(workflow.record, step_name, index),
                    child.arguments,
                ),
                child.parent_close,
            )
            for index, child in enumerate(members)
        ]
        return StepOutcome("fan_out", children=children, output=output)
    jobs = []
    for index, job in enumerate(members):
        if isinstance(job, Child):
            raise TypeError(f"fan-out step {step_name} returned both Job and Child items: a fan-out has one kind")
        if not isinstance(job, Job):
            raise TypeError(f"fan-out step {step_name} returned {job!r} at index {index}, not a Job or a Child")
        arguments = encode_payload({"args": job.args, "kwargs": job.kwargs}, f"arguments of {job.path} #{index}")
        jobs.append((job.path, arguments))
    return StepOutcome("fan_out", jobs=jobs, output=output)


def log_outcome(run: WorkflowRun, step: WorkflowStep, outcome: StepOutcome) -> None:
    """Log an attempt that ended in an error (the event has the rest)."""
    if outcome.kind == "error":
        logger.warning(
            "Step failed: %s %s step %s attempt %s: %s: %s",
            run.workflow_class,
            run.workflow_id,
            step.step_name,
            step.attempt,
            type(outcome.error).__name__,
            outcome.error,
        )
