"""``ctx``: what a durable function calls, replaying what its run recorded (``driver`` calls the function).

Each run of the function replays: ``ctx.step`` of a recorded checkpoint returns its output
without calling its body; the first new checkpoint runs its body, whose output is recorded
before the function goes on, or, when the worker has other work in hand, with the call's
outcome at the next new checkpoint, where the call ends (``services.checkpoint_end``). The
function stops (:class:`Stopped`) where the engine must take over: a checkpoint failed and its
policy reattempts or pauses, the run was paused or cancelled, the attempt was taken from it,
the call ends to share its commit.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Callable, Iterable
from datetime import timedelta
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ..dsl.definitions import StepDefinition, coerce_duration
from ..exceptions import ConfigurationError, NonDeterministicRun, StepFailed
from ..services.context import StepContext
from ..services.payload import encode_payload, storable_text
from .names import ENTRY, Renaming, class_name
from .options import checkpoint_definition

if TYPE_CHECKING:
    from ..models import WorkflowStep
    from ..services.outcome import StepOutcome
    from .checkpoints import Recorded


#: A call ends at its new checkpoint to share that commit only up to this position in the
#: function: each call replays from the top, so further on the replay would cost more than the
#: commit it saves, and the function goes on with a commit of its own per checkpoint.
SHARED_COMMITS_UP_TO = 100


class Stopped(BaseException):
    """The function stops here; the engine goes on from the rows (a BaseException, see below).

    It derives from ``BaseException`` so that the function's own ``except Exception:`` cannot
    swallow it and run on past a checkpoint the engine has not recorded.
    """

    def __init__(self, error: BaseException | None = None, outcome: StepOutcome | None = None) -> None:
        super().__init__()
        #: The error the attempt in hand ends with (its policy decides); None: nothing to apply.
        self.error = error
        #: The outcome the call ends with: the new checkpoint it ran, written with other outcomes.
        self.outcome = outcome


class Pending(NamedTuple):
    """A new checkpoint whose body ran and whose output is written when the call ends (``others_waiting``)."""

    step: WorkflowStep
    checkpoint: str
    output: Any
    renaming: Renaming | None


class DurableContext:
    """The ``ctx`` a durable function receives: checkpoints, and what the run is about."""

    def __init__(self, workflow: Any, context: StepContext, rows: ModuleType, replay: list[Recorded]) -> None:
        self._workflow = workflow
        #: ``durable.checkpoints``, which writes the rows (passed in: it imports the models).
        self._rows = rows
        self._context = context
        self._replay = replay
        self._position = 0
        self._counts: dict[str, int] = {}
        self._current: str | None = None
        #: What the function's row becomes with the checkpoint's outcome (see :meth:`_take`).
        self._renaming: Renaming | None = None
        #: The call ends at its next new checkpoint (another's work waits for the worker): the
        #: one it ran then is recorded with the call's outcome, not in a transaction of its own.
        self._ends_at_checkpoint = context.others_waiting
        self._pending: Pending | None = None
        #: Whether the replay holds every checkpoint up to the pending one (see :meth:`_keep`).
        self._hands_on = False

    @property
    def subject(self) -> Any:
        """The run's subject (a model instance), or None."""
        return self._workflow.subject

    @property
    def arguments(self) -> dict[str, Any]:
        """The run's arguments, as ``start`` stored them."""
        return dict(self._workflow.arguments)

    @property
    def workflow_id(self) -> str:
        """The run's ``workflow_id``."""
        return str(self._workflow.record.workflow_id)

    @property
    def step_idempotency_key(self) -> str:
        """``<workflow_id>:<checkpoint>`` while a checkpoint's body runs: the same on every attempt."""
        if self._current is None:
            raise ConfigurationError("ctx.step_idempotency_key is only there while a checkpoint's body runs")
        return f"{self.workflow_id}:{self._current}"

    def step(self, name: str, fn: Callable[[], Any], **options: Any) -> Any:
        """Run checkpoint ``name`` once: ``fn()``'s JSON return, recorded, then replayed on later runs.

        The n-th call of one name is the checkpoint ``name#n``. ``options`` are a step's
        (``functions.options``): ``on_exception`` an ``OnException`` or an action, ``"raise"``
        recording the failure once the policy gives up and raising :class:`StepFailed` into the
        function, then and on every replay; ``atomic=True`` commits ``fn``'s writes with its output.
        """
        checkpoint = self._number(name)
        definition = checkpoint_definition(name, options)
        position = self._position
        if self._replayed(checkpoint):
            return self._recorded(position)
        return self._run(checkpoint, definition, fn)

    def _recorded(self, position: int) -> Any:
        """The output recorded at ``position``, or its recorded failure raised (:class:`StepFailed`)."""
        done = self._replay[position]
        if done.failure is not None:
            raise StepFailed(done.name, *done.failure)
        return done.output

    def _run(self, checkpoint: str, definition: StepDefinition, fn: Callable[[], Any]) -> Any:
        """Run the body ``fn`` of ``checkpoint``, reached for the first time, and record its output."""
        type(self._workflow).remember(definition)
        step = self._take(checkpoint, definition, lazy=True)
        self._current = checkpoint

        def body() -> Any:
            value = fn()
            return None if value is None else encode_payload(value, f"{checkpoint} output")

        try:
            if definition.atomic:  # fn's writes commit with its recorded output, or not at all
                record = partial(self._rows.record, strict=True, renaming=self._renaming)
                following, output = self._rows.atomic(step, body, record)
            else:
                output = body()
        except Exception as error:
            return self._failed(step, checkpoint, definition, error)
        finally:
            self._current = None
        if not definition.atomic:
            self._keep(step, checkpoint, output)
            return output
        self._renaming = None
        if following is None:
            raise Stopped()
        self._context.step = following
        return output

    def sleep(self, name: str, duration: timedelta | float) -> None:
        """Park the run for ``duration`` (a timedelta or seconds) at checkpoint ``name``; no thread is held.

        The function runs again from the top when the time has come, replaying to here.
        """
        wait = coerce_duration(duration, "ctx.sleep(duration)")
        checkpoint = self._number(name)
        if self._replayed(checkpoint):
            return None
        step = self._context.step
        if step.step_name == checkpoint:  # the sleep's next attempt: its time has come
            self._record(step, None)
            return None
        self._rows.sleep(self._take(checkpoint), wait)
        raise Stopped()

    def wait_for(self, signal: str, timeout: timedelta | float | None = None) -> Any:
        """The payload of signal ``signal`` (one sent earlier is kept), or None once ``timeout`` passes.

        The run parks until then: no thread, slot or lock is held. The checkpoint is named after
        the signal (``payment``, ``payment#2``...).
        """
        limit = None if timeout is None else coerce_duration(timeout, "ctx.wait_for(timeout)")
        checkpoint = self._number(signal)
        position = self._position
        if self._replayed(checkpoint):
            return self._replay[position].output
        step = self._context.step
        if step.step_name == checkpoint:
            woken, payload = self._rows.received(step)
            if woken:
                self._record(step, payload)
                return payload
        found = self._rows.wait(self._take(checkpoint), signal, limit)
        if found is None or not found[0]:
            raise Stopped()
        self._record(self._context.step, found[1])
        return found[1]

    def map(self, name: str, fn: Callable[[Any], Any], items: Iterable[Any], **options: Any) -> list[Any]:
        """Run ``fn(item)`` as one fan-out job per item; the run parks until all ended; their results, in order.

        ``fn`` is a module-level function (stored by its dotted path, as a fan-out job's).
        Options: ``max_attempts`` and ``backoff`` per job, ``on_job_failure`` ("fail" or "continue"),
        ``on_exception``.
        """
        from . import parking  # deferred: it imports the models, which the package root must not

        done, value = parking.map_items(self, name, fn, items, options)
        if not done:
            raise Stopped()
        return value  # type: ignore[no-any-return]

    def child(self, name: str, cls: type, subject: Any = None, **arguments: Any) -> Any:
        """Start ``cls`` once as a child run with ``subject`` and ``arguments``; park until it ends; its result.

        ``parent_close`` and ``on_exception`` are this call's options, not the child's arguments.
        """
        from . import parking  # deferred: it imports the models, which the package root must not

        done, value = parking.start_child(self, name, cls, subject, arguments)
        if not done:
            raise Stopped()
        return value

    def _replayed(self, checkpoint: str) -> bool:
        """True when the run recorded ``checkpoint`` at this position (another name: it stops the run)."""
        position = self._position
        self._position += 1
        if position >= len(self._replay):
            if self._pending is not None:  # the call ends here: the checkpoint it ran is its outcome
                raise Stopped(outcome=self.ended_at_checkpoint())
            return False
        done = self._replay[position]
        if done.name != checkpoint:
            raise Stopped(
                NonDeterministicRun(
                    f"Checkpoint {checkpoint!r} was reached where the run recorded {done.name!r} "
                    f"(position {position + 1})"
                )
            )
        return True

    def _keep(self, step: WorkflowStep, checkpoint: str, output: Any) -> None:
        """Record a new checkpoint's output now, or, when the call ends at the next one, with the call's outcome.

        The function goes on in memory meanwhile, as a replay would: only to its next new
        checkpoint (or its return), where the call ends (:meth:`_replayed`).
        """
        if not self.shares_commit():
            self._record(step, output)
            return
        self._pending = Pending(step, checkpoint, output, self._renaming)
        self._renaming = None
        # Every position before this one is in the replay unless a checkpoint of this call was
        # recorded another way (a failure raised into the function, an atomic body's): then
        # the next call reads them all from the rows.
        self._hands_on = self._replay_complete()
        self._note(step, self._pending.renaming, output)

    def shares_commit(self) -> bool:
        """Whether the new checkpoint just run is recorded with the call's outcome (:meth:`_keep`), not now."""
        return self._ends_at_checkpoint and self._position <= SHARED_COMMITS_UP_TO

    def record_pending(self) -> None:
        """Record the checkpoint still to record now, in a transaction of its own (the function raised)."""
        step, _, output, self._renaming = cast(Pending, self._pending)
        self._pending = None
        self._record(step, output)

    def ended_at_checkpoint(self, returned: Any = None, finished: bool = False) -> StepOutcome:
        """The call's outcome: the pending checkpoint's output, and the run's result when the function ``finished``.

        It hands the row that carries the function on the checkpoints recorded with it.
        """
        from ..services.checkpoint_end import CheckpointEnd  # deferred: it imports the models
        from ..services.outcome import StepOutcome

        _, _, output, renaming = cast(Pending, self._pending)
        attempts = dict(getattr(self._replay, "attempts", {}))
        end = CheckpointEnd(
            renamed=None if renaming is None else (renaming.checkpoint, renaming.attempt),
            entry_attempt=None if renaming is None else renaming.entry_attempt,
            carried=self._rows.Replay(list(self._replay), attempts) if self._hands_on else None,
            finished=finished,
            result=returned,
        )
        return StepOutcome("success", output=output, checkpoint=end)

    def _record(self, step: WorkflowStep, output: Any) -> None:
        """Record checkpoint ``step``'s output now; the function goes on on the row that carries it on."""
        renaming, self._renaming = self._renaming, None
        following = self._rows.record(step, output, renaming=renaming)
        if following is None:
            raise Stopped()
        if self._replay_complete():  # what the call hands on stays what the rows hold
            self._note(step, renaming, output)
        self._context.step = following

    def _replay_complete(self) -> bool:
        """Whether the replay holds every checkpoint before the one at hand (none recorded another way)."""
        return len(self._replay) == self._position - 1

    def _note(self, step: WorkflowStep, renaming: Renaming | None, output: Any) -> None:
        """Add a checkpoint this call recorded (or will) to its replay, as ``checkpoints.recorded`` reads it."""
        name, attempt = (step.step_name, step.attempt) if renaming is None else renaming[:2]
        self._replay.append(self._rows.Recorded(name, output))
        attempts = getattr(self._replay, "attempts", None)
        if attempts is not None:
            attempts[name] = max(attempts.get(name, 0), attempt)

    def _number(self, name: str) -> str:
        if not isinstance(name, str) or not name or "@" in name or "#" in name:
            raise ConfigurationError(f"A checkpoint's name is a non-empty string without '@' or '#', got {name!r}")
        count = self._counts[name] = self._counts.get(name, 0) + 1
        return name if count == 1 else f"{name}#{count}"

    def _take(self, checkpoint: str, definition: StepDefinition | None = None, lazy: bool = False) -> WorkflowStep:
        """The in-progress row for ``checkpoint``: the row carrying the function on, renamed, or its retry.

        Under ``definition``'s queue, priority, limits and timeout (``functions.attempts.take``).
        ``lazy``: a row that already has those, for a checkpoint without a policy of its own, is
        renamed with the checkpoint's outcome, in its transaction (:attr:`_renaming`), not in one
        of its own before the body; should the body fail, it is renamed then (:meth:`_failed`),
        so its policy finds it by name. An attempt stalled meanwhile stays the function's row.
        """
        step = self._context.step
        if step.step_name == checkpoint:
            if definition is None:
                return step
            fitted: WorkflowStep | None = self._rows.take(step, checkpoint, definition)
            if fitted is None:
                raise Stopped()
            self._context.step = fitted
            return fitted
        if step.step_name != ENTRY:
            raise Stopped(
                NonDeterministicRun(
                    f"Checkpoint {checkpoint!r} was reached where the run was due at {step.step_name!r}"
                )
            )
        attempts = getattr(self._replay, "attempts", {})
        attempt = attempts.get(checkpoint, 0) + 1  # on after a rewind's
        # A policy of its own must find a stalled attempt by its name (the sweep applies it then).
        if lazy and definition is not None and definition.on_exception is None and self._rows.fits(step, definition):
            self._renaming = Renaming(checkpoint, attempt, attempts.get(ENTRY, 0) + 1)
            return step
        adopted: WorkflowStep | None = self._rows.take(step, checkpoint, definition, attempt)
        if adopted is None:
            raise Stopped()
        self._context.step = adopted
        return adopted

    def _failed(self, step: WorkflowStep, checkpoint: str, definition: StepDefinition, error: Exception) -> Any:
        if self._renaming is not None:  # the attempt's policy and history go by the checkpoint's name
            name, attempt, _ = self._renaming
            self._renaming = None
            renamed: WorkflowStep | None = self._rows.take(step, name, definition, attempt)
            if renamed is None:
                raise Stopped()
            self._context.step = step = renamed
        if self._rows.gives_up_raising(type(self._workflow), definition, error, step):
            text = storable_text("".join(tb.format_exception(type(error), error, error.__traceback__)))
            following = self._rows.record_raised(step, error, text)
            if following is None:
                raise Stopped()
            self._context.step = following
            failed = StepFailed(checkpoint, class_name(error), str(error))
            raise failed from error
        raise Stopped(error)
