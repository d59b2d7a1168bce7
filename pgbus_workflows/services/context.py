"""What passes between the executor and a running step body: the attempt's context, and the verbs' early end.

The executor sets a :class:`StepContext` on the instance; the body's verbs end it by raising
:class:`FlowControl`, which the executor turns into the attempt's outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..models import WorkflowSignal, WorkflowStep


class FlowControl(BaseException):
    """Raised by the step verbs to end a body at once; a BaseException so ``except Exception`` misses it.

    Kind ``"outcome"`` carries a whole ``StepOutcome`` as its value: a durable function's
    driver ends its call with the checkpoint it ran, to be written with other outcomes.
    """

    def __init__(self, kind: str, *, wait: Any = None, reason: str | None = None, value: Any = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.wait = wait
        self.reason = reason
        self.value = value


@dataclass
class StepContext:
    """What the executor tells the instance about the attempt it is running."""

    step: WorkflowStep
    received_signal: WorkflowSignal | None = None
    timed_out: bool = False
    #: The body runs inside the outcome's transaction (``atomic=True``), holding the run's lock.
    atomic: bool = False
    #: A fan-out body: ``output()`` keeps its value beside the items the body returns.
    fan_out: bool = False
    #: What a fan-out body passed to ``output()``.
    kept_output: Any = None
    #: ``step_idempotency_key``, once read (an ``async def`` body's is read before it starts).
    idempotency_key: str | None = None
    #: Set by a durable function's driver that recorded its own outcomes and stopped: the
    #: attempt in hand has nothing left to apply. The driver may also move :attr:`step` on
    #: to the row that carries the function on (``pgbus_workflows.functions``).
    applied: bool = False
    #: Set by an ``async def`` durable function's driver: its coroutine reads nothing of ``self``
    #: beforehand, and bounds each checkpoint's body by that checkpoint's ``timeout=``, not the
    #: whole function by the row's (``pgbus_workflows.functions.async_context``).
    drives_function: bool = False
    #: Set by a dispatcher's worker that holds other work to run or write: a durable function
    #: then ends its call at its next new checkpoint, and that checkpoint's output is written
    #: with the others' outcomes, in one transaction (``pgbus_workflows.functions``).
    others_waiting: bool = False
