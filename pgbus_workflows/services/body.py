"""Calling a step body: its return, verb or exception becomes exactly one :class:`StepOutcome`.

Also the log line of an attempt that failed.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

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

T = TypeVar("T")


def run_body(workflow: RunHandle, context: StepContext) -> StepOutcome:
    """Call the step body with the step context set; never raises.

    An ``async def`` body is awaited on this thread (:meth:`Awaiting.run_here`).
    """
    started = start_body(workflow, context)
    if not isinstance(started, Awaiting):
        return started
    # None comes only from a durable function's driver, which an atomic step never runs.
    return cast(StepOutcome, started.run_here())


def start_body(workflow: RunHandle, context: StepContext) -> StepOutcome | AwaitingBody:
    """Call the step body: its outcome, or, for an ``async def`` body, its coroutine still to await.

    The dispatcher awaits that coroutine on its event loop (``dispatcher.coroutines``), so it
    holds no thread; what ``self`` reads from the database (the subject, the outputs, the step's
    key) is read here first, as inside the coroutine Django refuses a query that is not awaited.
    Never raises.
    """
    step = context.step
    definition = type(workflow).step_definition(step.step_name)
    if definition is None or definition.func is None:  # the guards ruled this out
        raise StepNotDefined(step.step_name)
    workflow._context = context
    context.fan_out = definition.kind == "fan_out"
    try:
        value = definition.func(workflow)
    except BaseException as error:
        return _settled(workflow, context, None, error)
    if not inspect.isawaitable(value):
        return _settled(workflow, context, value, None)
    if not context.drives_function:
        for name in ("subject", "outputs", "step_idempotency_key"):
            getattr(workflow, name, None)
    run = workflow.record
    return AwaitingBody(
        value,
        None if context.drives_function else definition.timeout,
        f"{run.workflow_class} {run.workflow_id} step {step.step_name} (attempt {step.attempt})",
        partial(_settled_later, workflow, context),
        context,
    )


def _settled_later(
    workflow: RunHandle, context: StepContext, value: Any, error: BaseException | None
) -> StepOutcome | None:
    """:func:`_settled` for a coroutine; None when a durable function's driver applied its outcomes itself."""
    if error is None and context.applied:
        return None
    return _settled(workflow, context, value, error)


def _settled(workflow: RunHandle, context: StepContext, value: Any, error: BaseException | None) -> StepOutcome:
    """The outcome of a body that returned ``value`` or raised ``error``: exactly one, never raises."""
    step_name = context.step.step_name
    workflow._context = context
    try:
        try:
            if error is not None:
                raise error
        except FlowControl as flow:
            if flow.kind == "outcome":  # a durable function's driver made the outcome itself
                return cast(StepOutcome, flow.value)
            if flow.kind == "finished":
                return StepOutcome("finished", output=_encoded(flow.value, f"{step_name} result"))
            if flow.kind != "output":
                return StepOutcome(flow.kind, wait=flow.wait, reason=flow.reason)
            value = flow.value
        if context.fan_out:
            return _fan_out(workflow, step_name, value, context)
        return StepOutcome("success", output=_encoded(value, f"{step_name} output"))
    except FlowControl as flow:  # a verb called while encoding the output (a custom encoder)
        return StepOutcome(flow.kind, wait=flow.wait, reason=flow.reason)
    except BodyTimedOut as timed_out:  # the coroutine was cancelled: the attempt stalls, as a hung one would
        return StepOutcome("stall", error=timed_out, details={"detection": "timeout"})
    except BaseException as raised:
        # SystemExit, KeyboardInterrupt, GeneratorExit, CancelledError too: a body ends in one
        # recorded outcome whatever it raises, and the worker thread lives on.
        if isinstance(raised, CONNECTION_ERRORS) and (connection.connection is None or not connection.is_usable()):
            # The database went away under the body (a restart, a failover): not the body's
            # fault, so not its policy's: the attempt stalls, as on a crash (STALL_ACTION).
            return StepOutcome("stall", error=raised)
        return StepOutcome.from_error(raised)
    finally:
        workflow._context = None


class BodyTimedOut(Exception):
    """An ``async def`` body ran past its step's ``timeout=``: it was cancelled."""


class Awaiting(Generic[T]):
    """An ``async def`` body (or job) called and not yet awaited, and what turns its end into ``T``.

    The dispatcher awaits :attr:`coroutine` on its event loop and hands the value (or the
    exception) to :meth:`settle` on a worker thread; :meth:`run_here` does both on this thread.
    """

    def __init__(
        self,
        coroutine: Awaitable[Any],
        timeout: timedelta | None,
        label: str,
        settle: Callable[[Any, BaseException | None], T],
    ) -> None:
        self.coroutine = coroutine
        self.timeout = timeout
        #: What logs name it by: the class, run and step (or the job).
        self.label = label
        self._settle = settle
        #: The caller's context (an attempt's trace span), which the coroutine runs in.
        self.context = contextvars.copy_context()
        self._when_settled: list[Callable[[T], None]] = []

    def when_settled(self, callback: Callable[[T], None]) -> None:
        """Call ``callback`` with the result once it is settled (the attempt's span ends then)."""
        self._when_settled.append(callback)

    def settle(self, value: Any, error: BaseException | None) -> T:
        """The result of a coroutine that returned ``value`` or raised ``error``."""
        result = self._settle(value, error)
        for callback in self._when_settled:
            callback(result)
        return result

    def run_here(self) -> T:
        """Await the coroutine on an event loop of this thread's own, then settle it.

        Its awaited ORM calls run on this thread, with its connection (asgiref hands them back).
        """
        try:
            value = self.context.run(async_to_sync(bounded), self.coroutine, self.timeout)
        except BaseException as error:
            return self.settle(None, error)
        return self.settle(value, None)


class AwaitingBody(Awaiting[StepOutcome | None]):
    """A step body's coroutine: it settles into the outcome of :attr:`attempt`, or None (nothing to apply).

    A durable function's driver records checkpoints as it goes and may end on a row other
    than the one claimed, or with every outcome applied already.
    """

    def __init__(
        self,
        coroutine: Awaitable[Any],
        timeout: timedelta | None,
        label: str,
        settle: Callable[[Any, BaseException | None], StepOutcome | None],
        step_context: StepContext,
    ) -> None:
        super().__init__(coroutine, timeout, label, settle)
        self._step_context = step_context

    @property
    def attempt(self) -> WorkflowStep:
        """The attempt the settled outcome is for: the row claimed, or the one a durable function moved on to."""
        return self._step_context.step


async def bounded(coroutine: Awaitable[Any], timeout: timedelta | None) -> Any:
    """Await ``coroutine``; past ``timeout`` it is cancelled and :class:`BodyTimedOut` raised.

    A heartbeat from the body (:func:`extend_deadline`) starts ``timeout`` again from then. A
    ``TimeoutError`` of the body's own goes to its policy as any error.
    """
    if timeout is None:
        return await coroutine
    seconds = timeout.total_seconds()
    try:
        async with asyncio.timeout(seconds) as deadline:
            kept = _deadline.set((deadline, seconds))
            try:
                return await coroutine
            finally:
                _deadline.reset(kept)
    except TimeoutError:
        if deadline.expired():
            raise BodyTimedOut(f"cancelled after its timeout of {timeout}") from None
        raise


#: The awaited body's deadline and its timeout in seconds (None: no ``timeout=``), for its heartbeats.
_deadline: contextvars.ContextVar[tuple[asyncio.Timeout, float] | None] = contextvars.ContextVar(
    "pgbus_workflows_deadline", default=None
)


def extend_deadline() -> None:
    """An async body's heartbeat: its ``timeout=`` counts again from now (as the sweep's deadline does)."""
    current = _deadline.get()
    if current is not None:
        deadline, seconds = current
        deadline.reschedule(asyncio.get_running_loop().time() + seconds)


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
    """Log an attempt that ended in an error (the event has the rest).

    A reattempt its exception policy expects is logged at INFO, with its number and wait; an
    error that pauses, cancels or skips the run at WARNING (``Step failed``).
    """
    if outcome.kind != "error":
        return
    if outcome.reattempt is not None:
        number, most, wait = outcome.reattempt
        logger.info(
            "Step %s of %s %s raised %s: %s; reattempt %s in %s s (its exception policy)",
            step.step_name,
            run.workflow_class,
            run.workflow_id,
            type(outcome.error).__name__,
            outcome.error,
            number if most is None else f"{number} of {most}",
            f"{wait.total_seconds():g}",
        )
        return
    logger.warning(
        "Step failed: %s %s step %s attempt %s: %s: %s",
        run.workflow_class,
        run.workflow_id,
        step.step_name,
        step.attempt,
        type(outcome.error).__name__,
        outcome.error,
    )
