"""What a step body can read and do on ``self``: the attempt, its signal, and the verbs that end it.

``Workflow`` inherits these; they raise ``NotInStep`` outside a running body. The verbs end
the body by raising :class:`FlowControl`, which the executor turns into the step's outcome.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..dsl.definitions import coerce_duration
from ..exceptions import NotInStep
from ..services.context import FlowControl, StepContext

if TYPE_CHECKING:
    from ..models import WorkflowRun, WorkflowSignal, WorkflowStep

__all__ = ["FlowControl", "StepBody", "StepContext"]


class StepBody:
    """The step-body half of ``Workflow`` (see the module docstring)."""

    record: WorkflowRun
    _context: StepContext | None

    def _step_context(self, what: str) -> StepContext:
        if self._context is None:
            raise NotInStep(f"{what} is only available inside a running step body")
        return self._context

    @property
    def step_idempotency_key(self) -> str:
        """``<workflow_id>:<step name>``: the same for every attempt of this step in this run.

        The name is the one the step's first attempt in this run had: a step renamed
        (``renamed_from``) while a run was on it keeps, in that run, its earlier attempts' key.
        """
        context = self._step_context("step_idempotency_key")
        if context.idempotency_key is None:
            context.idempotency_key = f"{self.record.workflow_id}:{self._first_name(context.step)}"
        return context.idempotency_key

    def _first_name(self, step: WorkflowStep) -> str:
        """The name of the step's first attempt in this run, among the step's names (its own, ``renamed_from``)."""
        definition = self.step_definition(step.step_name)  # type: ignore[attr-defined]  # Workflow's
        if definition is None or not definition.renamed_from:
            return step.step_name
        from ..models import WorkflowStep  # deferred: this module loads before the app registry

        names = (definition.name, *definition.renamed_from)
        attempts = WorkflowStep.objects.filter(run_id=self.record.pk, step_name__in=names)
        return attempts.order_by("pk").values_list("step_name", flat=True).first() or step.step_name

    @property
    def attempt(self) -> int:
        """The 1-based attempt number of the running step."""
        return self._step_context("attempt").step.attempt

    @property
    def received_signal(self) -> WorkflowSignal | None:
        """The signal that woke this ``wait_for`` step (None when its wait timed out)."""
        return self._step_context("received_signal").received_signal

    @property
    def timed_out(self) -> bool:
        """True when this ``wait_for`` step runs because its ``wait_timeout`` passed."""
        return self._step_context("timed_out").timed_out

    def reattempt(self, wait: timedelta | float | None = None) -> None:
        """End the body and run this step again after ``wait`` (does not count as an error)."""
        self._step_context("reattempt()")
        raise FlowControl("reattempt", wait=coerce_duration(wait or 0, "reattempt(wait=)"))

    def finished(self, result: Any = None) -> None:
        """End the body and finish the run now; later steps do not run.

        ``result`` (JSON) becomes this step's output, and so the run's result (``wf.result()``).
        """
        self._step_context("finished()")
        raise FlowControl("finished", value=result)

    def output(self, value: Any) -> None:
        """End the body with ``value`` as its JSON output (the same as returning it).

        In a ``@fan_out`` body it does not end the body: ``value`` is kept as the step's own
        output beside the jobs or children the body returns (in ``self.outputs`` once the step
        resolves; the step's counts are then in its ``step_completed`` event).
        """
        context = self._step_context("output()")
        if context.fan_out:
            context.kept_output = value
            return
        raise FlowControl("output", value=value)

    def heartbeat(self) -> bool:
        """Tell the sweep this attempt is alive: its ``stall_at`` moves to now + its timeout.

        For a body that runs longer than ``STALL_THRESHOLD`` (or its ``timeout=``) on
        purpose: call it now and then, and the sweep will not take it for hung. Returns
        False when the attempt is no longer in progress (stalled or cancelled meanwhile):
        its outcome will be discarded, so the body may stop.

        An ``atomic=True`` body holds its run's lock, which already tells the sweep it is
        alive; its ``timeout=`` bounds its transaction and a heartbeat does not extend it
        (nothing is written: a write there would only commit with the outcome).
        """
        from ..services.claims import heartbeat  # services sit below: importing them here would be a cycle

        context = self._step_context("heartbeat()")
        return True if context.atomic else heartbeat(context.step)

    async def aheartbeat(self) -> bool:
        """:meth:`heartbeat` from an ``async def`` body: its write is awaited, as the async ORM's
        are, and the step's ``timeout=``, which cancels the coroutine, counts again from now."""
        from asgiref.sync import sync_to_async

        from ..services.body import extend_deadline  # services sit below: see heartbeat()

        alive: bool = await sync_to_async(self.heartbeat)()
        if alive:
            extend_deadline()
        return alive
