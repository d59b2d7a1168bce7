"""A durable function's checkpoints in the rows: what a run recorded, and recording one more.

The recorded checkpoints are read in one query when the function starts. A new checkpoint's
outcome is one transaction under the run's lock (:func:`record`): the row the function ran the
checkpoint on is renamed to it when it still bears :data:`ENTRY` (``ctx`` renames it only
before a body that needs its own route, limits or timeout), completed, and the row that
carries the function on is inserted already claimed by the same worker, so the function goes
on without a claim. Its statements go in the round trips of a batch of outcomes
(``locks.locked_steps``): the locks with the holds in force and the next attempt's number,
the writes, the COMMIT.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..models import WorkflowSignal, WorkflowStep
from ..services import waiting
from ..services.chain import Chain
from ..services.ledger import RunLedger
from ..services.locks import locked_step, locked_steps
from ..services.outcome import StepOutcome, apply_outcome, continue_after, error_message
from ..services.transactions import commit_once
from ..states import StepOutcomeKind, StepStatus
from .attempts import Gone
from .attempts import atomic as atomic  # what ``ctx`` calls through this module besides its own
from .attempts import fits as fits
from .attempts import gives_up_raising as gives_up_raising
from .attempts import take as take
from .names import ENTRY, RAISED, Renaming, class_name


@dataclass(frozen=True)
class Recorded:
    """A checkpoint the run recorded: its output, or the failure raised into the function."""

    name: str
    output: Any = None
    #: ``(exception_type, message)`` of a checkpoint that failed with ``on_exception="raise"``.
    failure: tuple[str, str] | None = None


class Replay(list[Recorded]):
    """The run's recorded checkpoints (:func:`recorded`), and the last attempt number of each name it has rows of.

    A checkpoint reached again after a rewind (``resume_at``, superseded) numbers its attempts on.
    """

    def __init__(self, done: list[Recorded], attempts: dict[str, int]) -> None:
        super().__init__(done)
        #: The highest attempt of every checkpoint name in the run's rows, superseded ones included,
        #: and of :data:`ENTRY` rows but the one the function runs on.
        self.attempts = attempts


def recorded(run_pk: int, running: int | None = None) -> Replay:
    """The run's checkpoints in the order the function first reached them, up to the first not done.

    One query; ``running`` is the row the function runs on. A checkpoint is done when its latest
    attempt succeeded, or failed with ``on_exception="raise"``; a later attempt of a name (a
    resume) replaces an earlier one, and supersedes every checkpoint reached after it
    (``resume_at`` rewinds there).
    """
    attempts: dict[str, int] = {}
    done = []
    for name, (status, outcome, output, error_class, message) in latest_attempts(run_pk, attempts, running).items():
        if status == StepStatus.COMPLETED and outcome == StepOutcomeKind.SUCCESS:
            done.append(Recorded(name, output))
        elif status == StepStatus.FAILED and output == RAISED:
            done.append(Recorded(name, failure=(error_class, message)))
        else:
            break
    return Replay(done, attempts)


def latest_attempts(
    run_pk: int, attempts: dict[str, int] | None = None, running: int | None = None
) -> dict[str, tuple[str, str, Any, str, str]]:
    """Each checkpoint's latest attempt (status, outcome, output, error), in the order the function reached them.

    A checkpoint attempted again after later ones were reached (a rewind) drops those: they
    are superseded, their rows kept as history. A reattempt is always the latest checkpoint,
    so it drops nothing. ``attempts`` gets the highest attempt number of every name, and of
    the :data:`ENTRY` rows but ``running``.
    """
    latest: dict[str, tuple[str, str, Any, str, str]] = {}
    for pk, name, attempt, status, outcome, output, error_class, message in (
        WorkflowStep.objects.filter(run_id=run_pk)
        .order_by("id")
        .values_list("pk", "step_name", "attempt", "status", "outcome", "output", "error_class", "error_message")
    ):
        if name == ENTRY:
            if attempts is not None and pk != running:
                attempts[name] = max(attempt, attempts.get(name, 0))
            continue
        if name in latest and next(reversed(latest)) != name:
            names = list(latest)
            for later in names[names.index(name) + 1 :]:
                del latest[later]
        latest[name] = (status, outcome, output, error_class, message)  # dicts keep the first insertion's order
        if attempts is not None:
            attempts[name] = max(attempt, attempts.get(name, 0))
    return latest


def record(
    step: WorkflowStep, output: Any, strict: bool = False, renaming: Renaming | None = None
) -> WorkflowStep | None:
    """Complete checkpoint ``step`` with ``output``; returns the claimed row that carries the function on.

    ``renaming``: what the row (still :data:`ENTRY`) becomes in the same write. None when the
    function must stop here: the attempt is no longer in progress (cancelled, or stalled by
    the sweep; ``strict``: :class:`Gone` is raised then), or the run was paused meanwhile (its
    next row is then held). A COMMIT whose answer was lost is not written twice
    (``commit_once``); inside an atomic body's transaction it is part of that.
    """
    # The next function row's attempt: read with the locks for a named row, known for one renamed here.
    following = ENTRY if renaming is None else None

    def write() -> WorkflowStep | None:
        with locked_steps([(step.run_id, step.pk, following)], savepoint=False) as [(ledger, locked)]:
            if ledger is None or locked is None or locked.status != StepStatus.IN_PROGRESS:
                if strict:
                    raise Gone(step.step_name if renaming is None else renaming.checkpoint)
                return None
            ledger.claim_for = Chain(claimed_by=locked.claimed_by)
            named = {}
            if renaming is not None:
                named = {"step_name": renaming.checkpoint, "attempt": renaming.attempt}
                ledger.next_attempts[ENTRY] = renaming.entry_attempt
            ledger.move_step(locked, "complete", outcome=StepOutcomeKind.SUCCESS, output=output, **named)
            continue_after(ledger, locked, kind="step_completed")
            return _carried_on(ledger)

    return commit_once(write, on_indexes=True)


def record_raised(step: WorkflowStep, error: BaseException, traceback: str) -> WorkflowStep | None:
    """Fail checkpoint ``step`` with ``error`` to raise it into the function; as :func:`record`."""
    error_type = class_name(error)
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is None or locked.status != StepStatus.IN_PROGRESS:
            return None
        ledger.claim_for = Chain(claimed_by=locked.claimed_by)
        ledger.move_step(
            locked,
            "fail",
            outcome=StepOutcomeKind.FAILED,
            output=RAISED,
            error_class=error_type[:255],
            error_message=error_message(error),
            traceback=traceback,
        )
        details = {"error_class": error_type, "error_message": error_message(error)[:2000], "action": "raise"}
        continue_after(ledger, locked, kind="step_failed", details=details)
        return _carried_on(ledger)


def sleep(step: WorkflowStep, wait: timedelta) -> None:
    """Park checkpoint ``step`` for ``wait``: its next attempt is due then (a reattempt, as a step's)."""
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is not None and locked.status == StepStatus.IN_PROGRESS:
            apply_outcome(ledger, locked, StepOutcome("reattempt", wait=wait, reason="sleep"))


def wait(step: WorkflowStep, signal: str, timeout: timedelta | None) -> tuple[bool, Any] | None:
    """Take a pending ``signal`` for checkpoint ``step``, else park it until one comes or ``timeout`` passes.

    Returns ``(True, payload)`` when a signal sent earlier was there (kept, as for ``wait_for``
    steps), ``(False, None)`` when the step parked (the function stops), None when gone.
    """
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is None or locked.status != StepStatus.IN_PROGRESS:
            return None
        pending = waiting.pending_signal(ledger, (signal,))
        if pending is not None:
            waiting.consume(ledger, pending, locked)
            locked.save(update_fields=["signal"])
            return True, pending.payload
        waiting.park(ledger, locked, (signal,), None if timeout is None else ledger.now + timeout)
        return False, None


def received(step: WorkflowStep) -> tuple[bool, Any]:
    """What woke the waiting checkpoint ``step``: ``(True, payload)`` of its signal, ``(True, None)`` at
    its timeout, ``(False, None)`` when neither (a resumed wait waits again)."""
    if step.signal_id is not None:
        return True, WorkflowSignal.objects.values_list("payload", flat=True).get(pk=step.signal_id)
    return bool(step.timed_out), None


def _carried_on(ledger: RunLedger) -> WorkflowStep | None:
    following = ledger.claim_chained()
    if following is not None:
        following.run = ledger.run
    return following
