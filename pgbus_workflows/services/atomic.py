"""``@step(atomic=True)``: the body runs inside the outcome's transaction, bounded by its ``timeout=``.

The run is locked, then the body runs in a savepoint; its writes commit with its outcome or not
at all. Because the body holds the run's lock for as long as it runs, nothing else may wait for
it: the sweep passes over locked runs, and the database enforces the step's ``timeout=`` (or
``STALL_THRESHOLD``) on the transaction itself: ``statement_timeout`` cancels a query that
runs past it, ``idle_in_transaction_session_timeout`` ends the session of a body that sits in
Python past it, and a body that returns past it is rolled back. The attempt then stalls, as
any attempt that outlives its timeout (``STALL_ACTION``, detection ``timeout``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from django.db import DatabaseError, IntegrityError, transaction

from .. import sql
from ..conf import settings
from ..models import WorkflowStep
from ..sql import clock
from ..states import StepStatus
from . import slots
from .applying import apply_instead
from .body import log_outcome, run_body
from .chain import Chain
from .claims import stall
from .context import StepContext
from .locks import locked_step
from .outcome import StepOutcome, apply_outcome, stall_step
from .transactions import CONNECTION_ERRORS, commit_once, with_reconnect

if TYPE_CHECKING:
    from .handle import RunHandle


@dataclass
class _Attempt:
    """What one try of the transaction did: the body's outcome, the steps it claimed for the worker."""

    outcome: StepOutcome | None = None
    stalled: bool = False
    chained: list[WorkflowStep] = field(default_factory=list)


class _RollBack(Exception):
    def __init__(self, outcome: StepOutcome) -> None:
        super().__init__(outcome.kind)
        self.outcome = outcome


def execute_atomic(workflow: RunHandle, step: WorkflowStep, chain: Chain | None) -> StepOutcome | None:
    """Run an ``atomic=True`` body and its outcome in one transaction; the outcome, or None.

    None when the attempt was no longer in progress, or when it stalled (past its timeout,
    or its transaction lost with the connection: the body's writes are gone with it).
    """
    limit = (step.timeout or settings.STALL_THRESHOLD).total_seconds()
    began = time.monotonic()
    attempt = _Attempt()
    try:
        commit_once(partial(_unit, workflow, step, chain, began, limit, attempt), retry=False)
    except CONNECTION_ERRORS:
        detection = "timeout" if time.monotonic() - began >= limit else "connection_lost"
        with_reconnect(partial(stall, step.pk, step.run_id, detection=detection))
        return None
    except Exception as error:
        # The outcome could not be written (or the COMMIT failed): the body's writes are rolled
        # back; the error is the attempt's, recorded in a transaction of its own.
        return apply_instead(step, attempt.outcome or StepOutcome("success"), error, chain)
    if chain is not None:
        chain.next_steps.extend(attempt.chained)  # only from a transaction known to have committed
    if attempt.outcome is None or attempt.stalled:
        return None
    log_outcome(step.run, step, attempt.outcome)
    return attempt.outcome


def _unit(
    workflow: RunHandle,
    step: WorkflowStep,
    chain: Chain | None,
    began: float,
    limit: float,
    attempt: _Attempt,
) -> None:
    """Inside the transaction: lock, bound it, run the body in a savepoint, apply the outcome."""
    attempt.chained.clear()
    with locked_step(step.run_id, step.pk, savepoint=False) as (ledger, locked):
        if locked is None or locked.status != StepStatus.IN_PROGRESS:
            slots.give_back(ledger, locked)  # cancelled before its body ran
            return
        _bound_transaction(limit - (time.monotonic() - began))
        workflow.record = ledger.run
        attempt.outcome = _run_in_savepoint(workflow, locked)
        attempt.stalled = time.monotonic() - began >= limit
        _bound_transaction(None)
        ledger.now = clock.now()  # the outcome's times are when the body ended, not when it began
        ledger.claim_for = chain
        if attempt.stalled:
            stall_step(ledger, locked, detection="timeout")  # the body's writes are rolled back
            return
        apply_outcome(ledger, locked, attempt.outcome)
        if chain is not None:
            step_after = ledger.claim_chained()
            if step_after is not None:
                attempt.chained.append(step_after)


def _run_in_savepoint(workflow: RunHandle, step: WorkflowStep) -> StepOutcome:
    """The body in a savepoint: kept when it succeeds, rolled back with its error otherwise."""
    try:
        with transaction.atomic():
            outcome = run_body(workflow, StepContext(step=step, atomic=True))
            if outcome.kind == "error":
                raise _RollBack(outcome)
            return _check_deferred_constraints(outcome)
    except _RollBack as rollback:
        return rollback.outcome
    except DatabaseError as error:
        # The body caught a database error and went on: its transaction was aborted, and
        # releasing the savepoint fails. Rolled back; the error is the attempt's.
        return StepOutcome.from_error(error, details={"atomic": "the body's transaction was aborted"})


def _bound_transaction(seconds: float | None) -> None:
    """Bound what follows in this transaction to ``seconds`` (None: no bound, for our own writes)."""
    if not sql.postgresql():
        return
    value = "0" if seconds is None else f"{max(int(seconds * 1000), 1)}ms"
    with sql.cursor() as cursor:
        cursor.execute(sql.statement("bound_transaction"), [value, value])


def _check_deferred_constraints(outcome: StepOutcome) -> StepOutcome:
    """Check the body's deferred constraints (Django's foreign keys) now, inside its savepoint.

    Otherwise a dangling foreign key would only fail at the outcome's COMMIT, after the
    outcome was applied: the error must roll the body back and go to the policy instead.
    """
    if not sql.postgresql():
        return outcome
    try:
        with transaction.atomic(), sql.cursor() as cursor:
            cursor.execute(sql.statement("constraints_immediate"))
            cursor.execute(sql.statement("constraints_deferred"))
    except IntegrityError as error:
        raise _RollBack(StepOutcome.from_error(error)) from error
    return outcome
