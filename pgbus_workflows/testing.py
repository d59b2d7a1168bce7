"""Test helpers: run a workflow's steps inline in your own ``TestCase``.

::

    class SignupTests(WorkflowTestMixin, TestCase):
        def test_drip(self):
            wf = SignupWorkflow.start(user)
            self.perform_next_step(wf)             # runs the first step now
            self.run_step_inline(wf, "reminder")   # raises unless "reminder" is next
            self.speedrun_workflow(wf)             # every step until the run is not ready
            self.deliver_signal(wf, "paid", {"amount": 42})   # signal, then the step it woke
            self.expire_wait(wf)                   # the waiting step's on_timeout applies now
            self.advance(timedelta(days=2))        # a virtual clock: waits, timeouts, ticks come due
            self.complete_fan_out(wf)              # every job of the waiting fan-out runs, then it resolves
            self.assertWorkflowStatus(wf, "finished")

        def test_nightly(self):
            [wf] = self.tick_schedules(now=datetime(2026, 1, 1, 3, tzinfo=UTC))   # the runs the ticks started

        async def test_from_async_code(self):
            wf = await SignupWorkflow.astart(user)
            await self.aspeedrun_workflow(wf)      # aperform_next_step, arun_step_inline, adeliver_signal,
                                                   # acomplete_fan_out: the same helpers, awaited

Every step runs through the real executor (claim, guards, policies, the audit trail)
against the test database, ignoring ``wait``: a step that is not due yet is pulled
forward with ``run_now`` (recorded with actor ``test_helpers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from asgiref.sync import sync_to_async

from .exceptions import InvalidTransition, StepWaiting, TestHelperError
from .functions.names import ENTRY
from .models import FanOutJob, JobStatus, WorkflowRun, WorkflowStep
from .services import operator
from .services.claims import claim_step
from .services.executor import execute_step
from .services.fanout import claim_job, execute_job
from .services.firing import fire_due, next_due_at
from .services.locks import locked_run, resolve_if_done
from .services.schedules import sync_declared
from .services.timeouts import expire_due_waits
from .services.waiting import fire_timeout, waiting_step
from .sql import clock
from .states import RunStatus, StepStatus
from .workflow import Workflow, handle_for

ACTOR = "test_helpers"
#: Rounds of firing :func:`tick_schedules` makes at most (each fires up to 100 ticks a schedule).
MAX_TICK_ROUNDS = 1000


def _waiting_for(workflow: Workflow) -> str:
    step = waiting_step(workflow.record)
    if step is None:
        return "is waiting"
    children = _children_of(step)
    if children:
        ongoing = [child for child in children if child.status not in (RunStatus.FINISHED, RunStatus.CANCELLED)]
        listed = ", ".join(f"{c.workflow_class} {c.workflow_id} ({c.status})" for c in ongoing[:5])
        more = f" and {len(ongoing) - 5} more" if len(ongoing) > 5 else ""
        return (
            f"is waiting on step {step.step_name}'s {len(children)} {'child' if len(children) == 1 else 'children'}, "
            f"{len(ongoing)} ongoing: "
            f"{listed}{more}: complete_fan_out runs them to their end"
        )
    if step.fan_out_total is not None:
        jobs = "fan-out job" if step.fan_out_total == 1 else "fan-out jobs"
        return f"is waiting on step {step.step_name}'s {step.fan_out_total} {jobs}: complete_fan_out moves it on"
    names = ", ".join(step.wait_for or [])
    timeout = ", expire_wait times it out" if step.timeout_at else ""
    return f"is waiting on step {step.step_name} for signal {names}: deliver_signal moves it on{timeout}"


def _children_of(step: WorkflowStep) -> list[WorkflowRun]:
    """The child runs a waiting fan-out attempt stands for, in their order."""
    if step.fan_out_total is None:
        return []
    return list(WorkflowRun.objects.filter(parent_job__step_id=step.pk).order_by("parent_job__index"))


def _ensure_ready(workflow: Workflow) -> None:
    """A run that is not ready has no claimable step: running it would silently do nothing."""
    status = workflow.reload().status
    if status == RunStatus.READY:
        return
    if status == RunStatus.WAITING:
        raise StepWaiting(f"{workflow!r} {_waiting_for(workflow)}")
    hints = {
        RunStatus.PAUSED: "resume() it first",
        RunStatus.FINISHED: "it is over; rerun() starts a new run",
        RunStatus.CANCELLED: "it is over; rerun() starts a new run",
        RunStatus.PERFORMING: "a step is still running",
    }
    raise TestHelperError(
        f"{workflow!r} is {status}, not ready: {hints.get(RunStatus(status), 'nothing inline can move it on')}"
    )


def _scheduled_step(workflow: Workflow) -> WorkflowStep | None:
    return WorkflowStep.objects.filter(run_id=workflow.record.pk, status=StepStatus.SCHEDULED).order_by("pk").last()


def _perform(workflow: Workflow, step: WorkflowStep) -> None:
    if step.scheduled_at > clock.now():
        try:
            operator.run_now(workflow.record.pk, actor=ACTOR, reason="run inline by a test helper")
        except InvalidTransition:
            if step.scheduled_at > clock.now():  # refused, and not because it came due meanwhile
                raise
    claimed = claim_step(step.pk, claimed_by=ACTOR)
    if claimed is None:
        raise TestHelperError(f"{workflow!r}: step {step.step_name} could not be claimed")
    execute_step(claimed)


def tick_schedules(now: datetime | None = None) -> list[Workflow]:
    """Fire every schedule tick due as of ``now`` (default: now), as the dispatcher's leader would.

    Syncs the classes' declared ``schedules`` first (a new one's first tick is the first after
    ``now``), then fires until nothing is due as of ``now`` (``catchup="all"``: every missed
    tick). Returns the handles of the runs started, in firing order; ``[]`` when nothing was
    due. The runs' steps do not run: ``speedrun_workflow`` them.
    """
    now = now or clock.now()
    sync_declared(now)
    started: list[Workflow] = []
    for _ in range(MAX_TICK_ROUNDS):
        # fire_due builds handles of registered classes: Workflow subclasses (workflow.handle_for says why).
        started.extend(cast("list[Workflow]", fire_due(now)))
        due = next_due_at()
        if due is None or due > now:
            return started
    raise TestHelperError(f"Schedules were still due as of {now.isoformat()} after {MAX_TICK_ROUNDS} rounds")


class WorkflowTestMixin:
    """Mix into ``TestCase`` / ``TransactionTestCase`` to run workflow steps inline."""

    def perform_next_step(self, workflow: Workflow) -> Workflow:
        """Run the run's scheduled step now; returns the reloaded handle."""
        _ensure_ready(workflow)
        step = _scheduled_step(workflow)
        if step is None:
            raise TestHelperError(f"{workflow!r} has no scheduled step")
        _perform(workflow, step)
        return workflow.reload()

    def run_step_inline(self, workflow: Workflow, step_name: str) -> Workflow:
        """Run the scheduled step when it is ``step_name``; raises when another step is next."""
        _ensure_ready(workflow)
        step = _scheduled_step(workflow)
        if step is None or step.step_name != step_name:
            scheduled = step.step_name if step else "nothing"
            raise TestHelperError(f"{workflow!r} is not about to run {step_name} (scheduled: {scheduled})")
        _perform(workflow, step)
        return workflow.reload()

    def speedrun_workflow(self, workflow: Workflow, max_steps: int = 1000) -> Workflow:
        """Run scheduled steps until the run is no longer ready.

        Stops at paused, finished and cancelled; raises :class:`StepWaiting` at waiting,
        naming what the step waits for.
        """
        for _ in range(max_steps):
            status = workflow.reload().status
            if status == RunStatus.READY:
                self.perform_next_step(workflow)
            elif status == RunStatus.WAITING:
                raise StepWaiting(f"{workflow!r} {_waiting_for(workflow)}")
            elif status == RunStatus.PERFORMING:
                raise TestHelperError(f"{workflow!r} is performing: speedrun_workflow cannot move it on")
            else:
                return workflow
        status = workflow.reload().status
        if status == RunStatus.WAITING:
            raise StepWaiting(f"{workflow!r} {_waiting_for(workflow)}")
        if status not in (RunStatus.READY, RunStatus.PERFORMING):
            return workflow
        raise TestHelperError(f"{workflow!r} was still {status} after {max_steps} steps")

    def deliver_signal(
        self, workflow: Workflow, name: str, payload: Any = None, idempotency_key: str | None = None
    ) -> Workflow:
        """Signal the run, then run the step it scheduled (the one it woke, or one that takes it).

        A duplicate delivery (a repeated idempotency key) wakes nothing, so it runs nothing.
        """
        signal = workflow.signal(name, payload, idempotency_key, actor=ACTOR, reason="delivered by a test helper")
        if signal.duplicate_delivery:
            return workflow.reload()
        return self.perform_next_step(workflow)

    def expire_wait(self, workflow: Workflow) -> Workflow:
        """Apply the waiting step's ``on_timeout`` now, whatever its ``timeout_at``."""
        step = waiting_step(workflow.record)
        if step is None or step.timeout_at is None:
            raise TestHelperError(f"{workflow!r} has no waiting step with a wait_timeout")
        with locked_run(workflow.record.pk) as ledger:
            locked = ledger.lock_step(step.pk)
            if locked is None or locked.status != StepStatus.WAITING:
                raise TestHelperError(f"{workflow!r}: step {step.step_name} stopped waiting")
            fire_timeout(ledger, locked)
        return workflow.reload()

    def complete_fan_out(self, workflow: Workflow) -> Workflow:
        """Run every job of the waiting fan-out inline through the real job executor, then resolve it.

        Unlike pgbus's helper (which marks the members completed without running them),
        the jobs really run: their results and failures are what the next steps see.
        A job with attempts left is retried at once, ignoring its backoff. Children run
        inline to their end (their own fan-outs too); a child that waits for a signal or
        is paused raises, naming it.
        """
        step = waiting_step(workflow.record)
        if step is None or step.fan_out_total is None:
            raise TestHelperError(f"{workflow!r} is not waiting on a fan-out")
        for child in _children_of(step):
            self._run_to_end(handle_for(child), workflow)
        while True:
            pending = list(FanOutJob.objects.filter(step_id=step.pk, status=JobStatus.PENDING).order_by("index"))
            if not pending:
                break
            for job in pending:
                claimed = claim_job(job.pk, claimed_by=ACTOR)
                if claimed is not None:
                    execute_job(claimed)
        resolve_if_done(step.pk, workflow.record.pk)
        return workflow.reload()

    def _run_to_end(self, child: Workflow, parent: Workflow) -> None:
        """Run a child inline until it is finished or cancelled."""
        for _ in range(1000):
            status = child.reload().status
            if status in (RunStatus.FINISHED, RunStatus.CANCELLED):
                return
            if status == RunStatus.READY:
                self.perform_next_step(child)
                continue
            step = waiting_step(child.record) if status == RunStatus.WAITING else None
            if step is not None and step.fan_out_total is not None:
                self.complete_fan_out(child)
                continue
            what = _waiting_for(child) if status == RunStatus.WAITING else f"is {status}"
            raise StepWaiting(f"Child {child!r} of {parent!r} {what}")
        raise TestHelperError(f"Child {child!r} of {parent!r} did not end after 1000 steps")

    def advance(self, duration: timedelta | float) -> list[Workflow]:
        """Let ``duration`` (a ``timedelta`` or seconds) pass on a virtual clock, with no sleeping.

        Every time the engine reads in this process is that much later for the rest of the
        test (undone when it ends): a wait or backoff that ends within it is due, so the next
        :meth:`perform_next_step` runs it as it is (no ``run_now``); a wait for a signal whose
        ``wait_timeout`` deadline passes gets its ``on_timeout`` now, as the dispatcher's sweep
        would apply it; and the schedule ticks that fall within it fire, as the dispatcher's
        leader would. Returns the handles of the runs those ticks started (their steps do not
        run). A duration that is not a ``timedelta`` or a number raises ``TypeError``; one
        that is not positive and finite, ``ValueError``.
        """
        if isinstance(duration, bool) or not isinstance(duration, timedelta | int | float):
            raise TypeError(f"advance() takes a timedelta or a number of seconds, got {duration!r}")
        try:
            step = duration if isinstance(duration, timedelta) else timedelta(seconds=duration)
        except (ValueError, OverflowError):  # NaN, infinity, beyond timedelta's range
            raise ValueError(f"advance() takes a finite duration, got {duration!r}") from None
        if step <= timedelta(0):
            raise ValueError(f"advance() moves time forward: got {duration!r}")
        if clock.skipped() == timedelta(0):
            self.addCleanup(clock.stop_skipping)
        clock.skip_ahead(step)
        now = clock.now()
        expire_due_waits(now)
        return tick_schedules(now)

    async def aadvance(self, duration: timedelta | float) -> list[Workflow]:
        """:meth:`advance`, awaited."""
        return await sync_to_async(self.advance)(duration)

    def tick_schedules(self, now: datetime | None = None) -> list[Workflow]:
        """Fire the schedule ticks due as of ``now``; returns the handles started (:func:`tick_schedules`)."""
        return tick_schedules(now)

    # -- from async tests: the same helpers, awaited (each runs on the thread of the test's sync code)

    async def aperform_next_step(self, workflow: Workflow) -> Workflow:
        """:meth:`perform_next_step`, awaited."""
        return await sync_to_async(self.perform_next_step)(workflow)

    async def arun_step_inline(self, workflow: Workflow, step_name: str) -> Workflow:
        """:meth:`run_step_inline`, awaited."""
        return await sync_to_async(self.run_step_inline)(workflow, step_name)

    async def aspeedrun_workflow(self, workflow: Workflow, max_steps: int = 1000) -> Workflow:
        """:meth:`speedrun_workflow`, awaited."""
        return await sync_to_async(self.speedrun_workflow)(workflow, max_steps)

    async def adeliver_signal(
        self, workflow: Workflow, name: str, payload: Any = None, idempotency_key: str | None = None
    ) -> Workflow:
        """:meth:`deliver_signal`, awaited."""
        return await sync_to_async(self.deliver_signal)(workflow, name, payload, idempotency_key)

    async def acomplete_fan_out(self, workflow: Workflow) -> Workflow:
        """:meth:`complete_fan_out`, awaited."""
        return await sync_to_async(self.complete_fan_out)(workflow)

    def assertWorkflowStatus(self, workflow: Workflow, status: str) -> None:  # noqa: N802 - unittest style
        """Fail unless the reloaded run has ``status``."""
        actual = workflow.reload().status
        if actual != status:
            raise self.failureException(f"Expected workflow to be {status}, but was {actual}")

    def assertStepsCompleted(self, workflow: Workflow, step_names: Sequence[str]) -> None:  # noqa: N802
        """Fail unless ``step_names`` are exactly the run's completed steps, in order.

        A durable run's are its checkpoints: the function's own ``@function`` row, which holds
        its result, is left out.
        """
        completed: list[Any] = list(
            WorkflowStep.objects.filter(run_id=workflow.record.pk, status=StepStatus.COMPLETED, outcome="success")
            .exclude(step_name=ENTRY)
            .order_by("pk")
            .values_list("step_name", flat=True)
        )
        if completed != list(step_names):
            raise self.failureException(
                f"Expected steps {list(step_names)} to be completed, but completed were {completed}"
            )

    failureException: type[BaseException]
    addCleanup: Any  # noqa: N815 (unittest's name, given by the TestCase this mixes into)
