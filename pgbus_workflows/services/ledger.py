"""What is written under a run's lock: transitions, events, new step rows, NOTIFY.

A :class:`RunLedger` holds one locked run (:mod:`.locks` takes the locks) and collects
what a unit of work changes: checked transitions of the run and its attempts, events,
new attempts and wake-ups, all written together when the unit ends.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Max

from .. import signals, sql
from ..conf import settings
from ..dsl.definitions import StepDefinition, resolve_wait
from ..exceptions import WaitTimedOut
from ..models import WorkflowEvent, WorkflowRun, WorkflowStep
from ..sql import clock, rows
from ..sql.bulk import WriteBatch, insert_statement, link
from ..states import (
    ACTIVE_STEP,
    TERMINAL_RUN,
    RunStatus,
    StepStatus,
    check_run_transition,
    step_event,
    unless_paused,
)
from . import fairness, limiting, transactions
from .handle import attempt_route, handle_class
from .lineage import end_parent_job
from .payload import storable_text

if TYPE_CHECKING:
    from .chain import Chain

SYSTEM_ACTOR = "system"
MAX_ACTOR_LENGTH = 255


class RunLedger:
    """The locked run and what a unit of work writes: saved and flushed once at the end."""

    def __init__(
        self,
        run: WorkflowRun,
        now: datetime | None = None,
        *,
        writes: WriteBatch | None = None,
        next_attempts: dict[str, int] | None = None,
    ) -> None:
        self.run = run
        self.now = now or clock.now()
        #: Shared with other ledgers of one transaction: writes are deferred to ``writes.send``.
        self.writes = writes
        #: The next attempt number of some steps, read with the lock (no query in ``schedule``).
        self.next_attempts = next_attempts or {}
        self.cls = handle_class(run.workflow_class)
        self._events: list[WorkflowEvent] = []
        self._run_fields: set[str] = set()
        self._queues: set[str] = set()
        self._after_commit: list[tuple[Any, dict[str, Any]]] = []
        #: The attempt this unit of work scheduled, if any.
        self.scheduled: WorkflowStep | None = None
        #: Set by the executor: who may take a step scheduled due now (a ``Chain``); the step
        #: is then inserted already claimed, and ``claim_chained`` records the claim.
        self.claim_for: Chain | None = None
        #: ``(status, step, reason)`` once the run ended in this unit of work (written at flush).
        self._ended: tuple[str, WorkflowStep | None, str | None] | None = None
        #: Whether the run was paused when the unit of work began (its scheduled attempt held).
        self._was_paused = run.status == RunStatus.PAUSED
        #: The concurrency slots attempts leaving ``in_progress`` give back (``services.limiting``).
        self.releasing: list[str] = []
        self._releasing_queue = ""
        #: ``(step pk, run pk)`` of fan-outs to resolve once the unit of work commits: the lock
        #: block that made this ledger resolves them (``locks.resolve_if_done``).
        self.settling: set[tuple[int, int]] = set()
        #: Pks of the parent's fan-out jobs a child run's end wrote: their fan-outs too.
        self.settling_jobs: set[int] = set()

    def lock_step(self, pk: int) -> WorkflowStep | None:
        """The step row ``pk`` of this run, locked (after the run, as always)."""
        return rows.lock(WorkflowStep, {"id": pk, "run_id": self.run.pk})

    def active_step(self) -> WorkflowStep | None:
        """The run's scheduled, in-progress or waiting attempt, locked; None when it has none."""
        return WorkflowStep.objects.select_for_update().filter(run_id=self.run.pk, status__in=ACTIVE_STEP).first()

    def set_run(self, **fields: Any) -> None:
        """Change fields of the run row (saved once at the end)."""
        for name, value in fields.items():
            setattr(self.run, name, value)
            self._run_fields.add(name)

    def transition(
        self,
        name: str,
        target: str,
        *,
        kind: str,
        actor: str | None = None,
        reason: str | None = None,
        step: WorkflowStep | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Move the run through the named transition (checked) and record the event.

        A paused run stays paused when its step moves on (``states.unless_paused``: ``hold``).
        """
        source = self.run.status
        name, target = unless_paused(name, source, target)
        check_run_transition(name, source, target)
        fields: dict[str, Any] = {"status": target, "status_changed_at": self.now}
        if target in TERMINAL_RUN:
            fields["finished_at"] = self.now
            self._ended = (target, step, reason)
        if target != "paused":
            fields["paused_reason"] = ""
        self.set_run(**fields)
        actor = actor or SYSTEM_ACTOR
        self.event(kind, actor=actor, reason=reason, step=step, details=details, transition=(name, source, target))
        self.send(
            signals.workflow_transitioned,
            transition=name,
            from_status=source,
            to_status=target,
            actor=actor,
        )

    def event(self, kind: str, **fields: Any) -> None:
        """Record an audit event (written with the rest of the unit of work); ``fields`` as :meth:`new_event`."""
        self._events.append(self.new_event(kind, **fields))

    def new_event(
        self,
        kind: str,
        *,
        actor: str | None = None,
        reason: str | None = None,
        step: WorkflowStep | None = None,
        details: dict[str, Any] | None = None,
        transition: tuple[str, str, str] | None = None,
    ) -> WorkflowEvent:
        """An audit event of this run, unsaved (:meth:`event` records one with the unit of work)."""
        if actor is not None and len(actor) > MAX_ACTOR_LENGTH:
            # Raised inside the unit of work: its transaction rolls back, nothing is written.
            raise ValueError(f"actor must be at most {MAX_ACTOR_LENGTH} characters, got {len(actor)}")
        name, source, target = transition or ("", "", "")
        if reason:
            reason = storable_text(reason)
        return rows.build(
            WorkflowEvent,
            run=self.run,
            step=step,
            kind=kind,
            transition=name,
            from_status=source,
            to_status=target,
            actor=actor or SYSTEM_ACTOR,
            reason=reason or "",
            details=details or {},
            created_at=self.now,
        )

    def send(self, signal: Any, **kwargs: Any) -> None:
        """Send a Django signal after commit, only when someone listens."""
        if signal.has_listeners():
            self._after_commit.append((signal, {"workflow_id": self.run.workflow_id, **kwargs}))

    def move_step(self, step: WorkflowStep, event: str, **fields: Any) -> None:
        """Move an attempt through ``event`` (``states.STEP_EVENTS``, checked) and save it."""
        target = step_event(event, step.status)
        if released := limiting.releases(step, step.status, target):
            self.give_back(released, step.queue)  # unless handed over to the run's next step
        step.status = target
        for name, value in fields.items():
            setattr(step, name, value)
        if target not in ACTIVE_STEP:
            step.finished_at = self.now
            fields["finished_at"] = self.now
            self.send(
                signals.step_finished,
                step_name=step.step_name,
                attempt=step.attempt,
                status=target,
                outcome=step.outcome,
                error_class=step.error_class,
                duration=(self.now - step.started_at).total_seconds() if step.started_at else None,
            )
        if self.writes is None:
            rows.update(step, ["status", *fields])
        else:
            self.writes.update(step, ["status", *fields])

    def give_back(self, names: list[str], queue: str) -> None:
        """Give back these concurrency slots at flush, and wake the dispatchers of ``queue`` then."""
        self.releasing += names
        self._releasing_queue = queue

    def schedule(
        self,
        definition: StepDefinition,
        *,
        wait: timedelta | None = None,
        attempt: int | None = None,
        retry_of: WorkflowStep | None = None,
    ) -> WorkflowStep:
        """Create the next attempt of ``definition`` (scheduled after its wait) and wake a dispatcher.

        A retry of a ``wait_for`` attempt (``retry_of``) keeps the signal it consumed, or its
        timeout: the signal was spent on this step, and the retry must not wait for another.
        """
        computed = {}
        if attempt is None:
            attempt = self.next_attempts.pop(definition.name, None)
        if attempt is None and (wait is not None or not callable(definition.wait)):
            # Numbered by the INSERT itself: one statement instead of a MAX query and an INSERT.
            computed["attempt"] = (sql.statement("next_attempt"), [self.run.pk, definition.name])
        elif attempt is None:
            previous = WorkflowStep.objects.filter(run_id=self.run.pk, step_name=definition.name)
            attempt = (previous.aggregate(n=Max("attempt"))["n"] or 0) + 1
        if wait is None:
            wait = resolve_wait(definition.wait, attempt or 1)
        step = self.new_attempt(definition, attempt or 1, wait, retry_of)
        queue = step.queue
        chained = self._may_chain(queue, wait) and limiting.hand_over(self.releasing, step)
        if chained and self.claim_for is not None:
            step.status = StepStatus.IN_PROGRESS
            step.started_at = self.now
            step.claimed_by = self.claim_for.claimed_by
            step.stall_at = self.now + (definition.timeout or settings.STALL_THRESHOLD)
        if self.writes is not None and not computed:
            self.writes.inserts.append(step)
        else:
            rows.insert(step, computed)
        self.set_run(current_step=definition.name)
        if not chained:
            self._queues.add(queue)
            fairness.tag(self, step)  # a class with Fairness: its place in the claims' order
        self.scheduled = step
        return step

    def new_attempt(
        self, definition: StepDefinition, attempt: int, wait: timedelta, retry_of: WorkflowStep | None = None
    ) -> WorkflowStep:
        """An attempt of ``definition`` due after ``wait``, unsaved (:meth:`schedule` inserts one)."""
        queue, priority = attempt_route(self.cls, definition, self.run)
        carry = (
            retry_of is not None
            # A wait step's, or a durable wait's whose signal came (or time ran out) before its attempt was lost.
            and bool(definition.wait_for or retry_of.signal_id is not None or retry_of.timed_out)
            and retry_of.step_name == definition.name
            # A wait that itself timed out (on_timeout="pause") waits again when resumed.
            and not retry_of.error_class.endswith(WaitTimedOut.__name__)
        )
        return rows.build(
            WorkflowStep,
            run=self.run,
            step_name=definition.name,
            attempt=attempt,
            queue=queue,
            priority=priority,
            scheduled_at=self.now + wait,
            timeout=definition.timeout,
            created_at=self.now,
            signal_id=retry_of.signal_id if carry and retry_of is not None else None,
            timed_out=bool(carry and retry_of is not None and retry_of.timed_out),
            limiters=limiting.bind(self.cls, definition, self.run, self.now, self.writes, self.releasing),
        )

    def _may_chain(self, queue: str, wait: timedelta) -> bool:
        chain = self.claim_for
        if chain is None or wait > timedelta(0) or self.run.status != RunStatus.PERFORMING:
            return False
        if chain.stop is not None and chain.stop.is_set():
            return False
        if chain.queues is not None and queue not in chain.queues:
            return False
        if chain.holds is None:  # an operator's hold stops chains as it stops claims
            chain.holds = transactions.holds_in_force()
        return ("class", self.run.workflow_class) not in chain.holds and ("queue", queue) not in chain.holds

    def claim_chained(self) -> WorkflowStep | None:
        """Record the claim of the step ``schedule`` inserted already claimed; returns it.

        The outcome moved the run to ready (``advance``): ``claim`` moves it on to performing,
        in the same transaction, so the audit trail keeps every transition.
        """
        step = self.scheduled
        if step is None or step.status != StepStatus.IN_PROGRESS or self.claim_for is None:
            return None
        if self.run.status != RunStatus.READY:  # cannot happen: schedule() checked; never leave it claimed
            self.move_step(step, "unclaim", started_at=None, claimed_by="", stall_at=None)
            self._queues.add(step.queue)
            return None
        details: dict[str, Any] = {"attempt": step.attempt, "claimed_by": step.claimed_by}
        self.transition("claim", RunStatus.PERFORMING, kind="step_started", step=step, details=details)
        step.run = self.run
        return step

    def wake(self, queue: str) -> None:
        """NOTIFY the dispatchers of ``queue`` when this unit of work commits."""
        self._queues.add(queue)

    def flush(self) -> None:
        """Save the run, insert the events, give back slots, queue the NOTIFY and the after-commit signals."""
        if limiting.release(self.releasing, self.writes):
            self.wake(self._releasing_queue)  # a step held back by a slot given back is claimed now
        self.releasing = []
        ended = self._announce_end()
        if self._after_commit:
            sender, pending = self.run.workflow_class, self._after_commit
            transaction.on_commit(lambda: _send_all(sender, pending))
            self._after_commit = []
        if self.writes is not None:
            self._defer(self.writes)
            self.writes.ended.update(ended)
            self.writes.after.extend(self._holds())
            return
        statements = []
        if self._run_fields:
            statements.append(rows.update_statement(self.run, sorted(self._run_fields)))
            self._run_fields.clear()
        statements += self._holds()  # after this unit's step rows: they were written as it went
        if self._events:
            statements.append(insert_statement(link(self._events), arrays=False))  # steps inserted since
            self._events = []
        if sql.postgresql():
            notify = sql.statement("notify")
            statements += [(notify, [settings.NOTIFY_CHANNEL, q]) for q in sorted(self._queues)]
            statements += [(notify, [ended_channel(), workflow_id]) for workflow_id in ended]
        self._queues.clear()
        sql.run_batch(statements)  # one round trip

    def _holds(self) -> list[sql.Statement]:
        """The write that holds the run's scheduled attempt while it is paused and releases it after.

        Only a unit of work that begins or ends with the run paused writes it: a held attempt
        is out of the claims' range of the due index (``WorkflowStep.held``), and the flag
        follows every move into and out of a pause, whichever verb or outcome made it.
        """
        paused = self.run.status == RunStatus.PAUSED
        if not (paused or self._was_paused):
            return []
        self._was_paused = paused
        return [(sql.statement("hold_steps"), [paused, self.run.pk, paused])]

    def release_hold(self, step: WorkflowStep) -> None:
        """Release the held attempt of a run that is no longer paused, and wake a dispatcher.

        For the hold of a pause that code older than ``held`` ended (a rolling deploy): its
        resume did not know to release it. Written at flush, as every hold.
        """
        self._was_paused = True
        self.event("hold_released", step=step, reason="the run's pause ended in code that does not release holds")
        self.wake(step.queue)

    def settle(self, step: WorkflowStep) -> None:
        """Once this unit of work commits, resolve the fan-out ``step`` of this run if its members all ended."""
        self.settling.add((step.pk, self.run.pk))

    def _announce_end(self) -> list[str]:
        """A run that ended: its parent's job learns it; returns the ids to NOTIFY on :func:`ended_channel`."""
        if self._ended is None:
            return []
        (status, step, reason), self._ended = self._ended, None
        if (job_pk := end_parent_job(self.run, status, step, reason, self.now, self.writes)) is not None:
            self.settling_jobs.add(job_pk)
        return [str(self.run.workflow_id)] if self.run.awaited else []  # someone awaits its result()

    def _defer(self, writes: WriteBatch) -> None:
        """Hand the run update, the events and the wake-ups to the shared batch."""
        if self._run_fields:
            writes.update(self.run, sorted(self._run_fields))
            self._run_fields.clear()
        writes.rows.extend(self._events)
        self._events = []
        writes.notify |= self._queues
        self._queues.clear()


def ended_channel() -> str:
    """The channel on which the end of an awaited run is announced (payload: its workflow id)."""
    return f"{settings.NOTIFY_CHANNEL}_ended"


#: One run's unit of work in a batch: its ledger (None: the run is gone) and its locked step.
Unit = tuple[RunLedger | None, WorkflowStep | None]


def _send_all(sender: str, pending: list[tuple[Any, dict[str, Any]]]) -> None:
    for signal, kwargs in pending:
        signal.send(sender=sender, **kwargs)
