"""A property test: random interleavings of everything that moves a run, checked against the rows.

A Hypothesis ``RuleBasedStateMachine`` on real PostgreSQL starts runs (a few subjects, so
the one-ongoing-run-per-subject rule is exercised, and repeated idempotency keys), runs
due steps and claims steps that are not due yet (some claimed steps are left in progress
for a later rule, so operators and signals meet a performing run), decides each attempt's
outcome from a plan a rule writes to a table the body reads (complete, raise, reattempt,
skip, pause, cancel, finished, or an operator verb called from inside the body, as a
concurrent operator would), applies the operator verbs to random runs, delivers signals
with random names and repeated keys, and fires timeouts (``expire_due_waits`` and the
sweep, with a ``now`` in the future).

Each verb's refusal is predicted from the rows (the operating guide's table) and must change
nothing; an allowed verb must do what the guide says. After every rule, from the rows
alone (``check_invariants``):

- at most one active step per run, and at most one ongoing run per (class, subject);
- a run's status agrees with its active step (ready: scheduled, waiting: waiting,
  performing: in progress, finished/cancelled: none), ``finished_at`` and ``paused_reason``
  agree with the status, ``current_step`` names the latest attempt, and an attempt is
  ``held`` exactly when it is scheduled and its run paused;
- the audit trail is a path through ``RUN_TRANSITIONS`` from ``started`` to the status,
  with one finish (cancel) transition exactly when the run is finished (cancelled);
- attempts follow definition order (or an operator's ``resume_at``), are numbered 1..n per
  step, never exceed ``max_reattempts`` error reattempts in a row, and each body ran at
  most once per attempt, only after its claim; a discarded outcome belongs to a cancelled
  or stalled attempt;
- signals: one ``signal_received`` event per row, consumed once by one step of their run
  that waits for that name, oldest first, and no step consumed two.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pgbus_workflows import OnException, Workflow, step
from pgbus_workflows.admin.operations import allowed_verbs
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.exceptions import (
    AlreadyRunning,
    IdempotencyConflict,
    InvalidTransition,
    NotOngoing,
    NotPaused,
    StepNotDefined,
    UnknownSignal,
)
from pgbus_workflows.models import Dispatcher, FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from pgbus_workflows.services import operator
from pgbus_workflows.services.claims import claim_due_steps, claim_step
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.timeouts import expire_due_waits
from pgbus_workflows.states import ACTIVE_STEP, ONGOING_RUN, RUN_TRANSITIONS, TERMINAL_RUN
from tests.support import CLOCK_SLACK
from tests.testapp.models import Order, SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.slow]

# -- the workflows ---------------------------------------------------------------------------------

PLANS = (
    "complete",
    "raise",
    "raise_other",
    "reattempt",
    "reattempt_later",
    "skip",
    "pause",
    "cancel",
    "finished",
    "op_pause",
    "op_cancel",
    "op_signal",
)

#: Half the attempts complete, so that runs get somewhere.
PLAN = st.one_of(st.just("complete"), st.sampled_from(PLANS))


class SmBoom(Exception):
    """Raised by a body whose plan is "raise": the class policy reattempts it twice, then pauses."""


def _plan(wf: Workflow) -> str:
    row = SideEffect.objects.filter(label=f"sm-plan:{wf.workflow_id}").order_by("-pk").first()
    return row.key if row is not None else wf.arguments.get("plan", "complete")


def act(wf: Workflow, step_name: str) -> Any:
    """Every body: record that this attempt ran, check what it was given, then follow the plan."""
    attempt = wf.attempt
    SideEffect.objects.create(label="sm-ran", key=f"{wf.workflow_id}:{step_name}:{attempt}")
    definition = type(wf).step_definition(step_name)
    if definition.wait_for:
        signal = wf.received_signal
        if signal is None and not wf.timed_out:
            SideEffect.objects.create(label="sm-violation", key=f"{step_name} ran with neither signal nor timeout")
        if signal is not None and wf.timed_out:
            SideEffect.objects.create(label="sm-violation", key=f"{step_name} ran with a signal and timed out")
        if signal is not None and signal.name not in definition.wait_for:
            SideEffect.objects.create(label="sm-violation", key=f"{step_name} ran with signal {signal.name}")
    plan = _plan(wf)
    pk = wf.record.pk
    if plan == "raise":
        raise SmBoom(f"{step_name} attempt {attempt} fails on purpose")
    if plan == "raise_other":
        raise ValueError("no policy matches this one")
    if plan == "reattempt":
        wf.reattempt()
    if plan == "reattempt_later":
        wf.reattempt(wait=3600)
    if plan == "skip":
        wf.skip()
    if plan == "pause":
        wf.pause("planned pause")
    if plan == "cancel":
        wf.cancel("planned cancel")
    if plan == "finished":
        wf.finished()
    try:  # an operator (or a webhook) acting while the body runs
        if plan == "op_pause":
            operator.pause(pk, actor="sm-concurrent", reason="while the body runs")
        elif plan == "op_cancel":
            operator.cancel(pk, actor="sm-concurrent", reason="while the body runs")
        elif plan == "op_signal":
            wf.signal("go", {"from": "body"})
    except InvalidTransition:
        pass  # the run was no longer in a state that allows it
    return {"step": step_name, "attempt": attempt}


class SmFlow(Workflow):
    """A plain step, a wait for a signal that pauses on timeout, a step an hour later, a last step."""

    name = "sm_flow"
    exception_policies = [OnException(SmBoom, action="reattempt", max_reattempts=2)]

    @step
    def first(self):
        return act(self, "first")

    @step(wait_for=["go", "alt"], wait_timeout=timedelta(hours=1))
    def gate(self):
        return act(self, "gate")

    @step(wait=timedelta(hours=1))
    def later(self):
        return act(self, "later")

    @step
    def last(self):
        return act(self, "last")


class SmWaits(Workflow):
    """Three waits, one per on_timeout, and error reattempts that are not due at once."""

    name = "sm_waits"
    exception_policies = [OnException(SmBoom, action="reattempt", wait=timedelta(minutes=10), max_reattempts=2)]

    @step(wait_for="go", wait_timeout=timedelta(minutes=5), on_timeout="run")
    def gate_run(self):
        return act(self, "gate_run")

    @step(wait_for=["go", "alt"], wait_timeout=timedelta(minutes=5), on_timeout="skip")
    def gate_skip(self):
        return act(self, "gate_skip")

    @step(wait_for="alt", wait_timeout=timedelta(minutes=5), on_timeout="cancel")
    def gate_cancel(self):
        return act(self, "gate_cancel")

    @step
    def done(self):
        return act(self, "done")


CLASSES = {cls.name: cls for cls in (SmFlow, SmWaits)}
MAX_REATTEMPTS = 2
#: Few runs, so that the rules meet the same runs again and again.
MAX_RUNS = 5
ERROR_REASONS = ("exception_policy", "precondition")
TABLES = [
    m._meta.db_table
    for m in (WorkflowRun, WorkflowStep, WorkflowEvent, WorkflowSignal, FanOutJob, Dispatcher, SideEffect, Order)
]


# -- reading the rows -------------------------------------------------------------------------------


def every_workflow_row() -> tuple[list[dict[str, Any]], ...]:
    """Every workflow row, to show that a refused call changed nothing."""
    return tuple(
        list(model.objects.order_by("pk").values())
        for model in (WorkflowRun, WorkflowStep, WorkflowEvent, WorkflowSignal, FanOutJob)
    )


def active_step(run: WorkflowRun) -> WorkflowStep | None:
    return WorkflowStep.objects.filter(run=run, status__in=ACTIVE_STEP).first()


def check_audit_trail(run: WorkflowRun, events: list[WorkflowEvent]) -> None:
    """The transition events are a path through RUN_TRANSITIONS from ``started`` to the run's status."""
    transitions = [e for e in events if e.to_status]
    assert transitions and transitions[0].kind == "started", f"{run}: the trail does not begin with started"
    assert (transitions[0].transition, transitions[0].to_status) == ("", "ready")
    status = "ready"
    for event in transitions[1:]:
        assert event.kind != "started", f"{run}: a second started event"
        assert event.transition in RUN_TRANSITIONS, f"{run}: unknown transition {event.transition!r}"
        assert event.from_status == status, f"{run}: {event.kind} from {event.from_status}, but the run was {status}"
        assert (event.from_status, event.to_status) in RUN_TRANSITIONS[event.transition], (
            f"{run}: {event.transition} {event.from_status} -> {event.to_status} is not in the table"
        )
        status = event.to_status
    assert status == run.status, f"{run}: the trail ends in {status}, the row says {run.status}"


def check_invariants() -> None:
    runs = list(WorkflowRun.objects.order_by("pk"))
    steps_by_run: dict[int, list[WorkflowStep]] = defaultdict(list)
    for row in WorkflowStep.objects.select_related("run").order_by("pk"):
        steps_by_run[row.run_id].append(row)
    events_by_run: dict[int, list[WorkflowEvent]] = defaultdict(list)
    for event in WorkflowEvent.objects.order_by("pk"):
        events_by_run[event.run_id].append(event)
    signals = list(WorkflowSignal.objects.order_by("pk"))
    steps_by_pk = {s.pk: s for rows in steps_by_run.values() for s in rows}

    # At most one ongoing run per (class, subject).
    ongoing = Counter(
        (r.workflow_class, r.subject_type, r.subject_id) for r in runs if r.status in ONGOING_RUN and r.subject_id
    )
    assert all(n == 1 for n in ongoing.values()), f"two ongoing runs for one subject: {ongoing}"

    for run in runs:
        rows = steps_by_run[run.pk]
        events = events_by_run[run.pk]
        active = [s for s in rows if s.status in ACTIVE_STEP]
        assert len(active) <= 1, f"{run}: several active steps {active}"
        expected = {"ready": "scheduled", "waiting": "waiting", "performing": "in_progress"}.get(run.status)
        if expected is not None:
            assert [s.status for s in active] == [expected], f"{run}: active steps {active}"
        if run.status in TERMINAL_RUN:
            assert active == [], f"{run}: a {run.status} run with an active step {active}"
            assert run.finished_at is not None
        else:
            assert run.finished_at is None, f"{run}: ongoing with finished_at"
        if run.status != "paused":
            assert run.paused_reason == "", f"{run}: paused_reason {run.paused_reason!r} while {run.status}"
        if rows:
            assert run.current_step == rows[-1].step_name, f"{run}: current_step {run.current_step}, last {rows[-1]}"
        for row in rows:
            if row.status not in ACTIVE_STEP:
                assert row.finished_at is not None, f"{run}: {row} ended without finished_at"
            if row.status == "in_progress":
                assert row.started_at is not None and row.stall_at is not None
            # Out of the claims' range exactly while its run is paused (models.WorkflowStep.held).
            assert row.held == (row.status == "scheduled" and run.status == "paused"), f"{run}: {row} held={row.held}"

        check_audit_trail(run, events)
        # A late outcome is discarded only when its attempt was cancelled or stalled meanwhile.
        for event in events:
            if event.kind == "outcome_discarded":
                row = next(r for r in rows if r.pk == event.step_id)
                assert row.status == "cancelled" or row.outcome == "stalled", f"{run}: discarded the outcome of {row}"
        finishes = [e for e in events if e.transition == "finish"]
        cancels = [e for e in events if e.transition == "cancel"]
        assert len(finishes) == (run.status == "finished"), f"{run}: finish events {finishes}"
        assert len([e for e in events if e.kind == "finished"]) == (run.status == "finished")
        assert len(cancels) == (run.status == "cancelled"), f"{run}: cancel events {cancels}"

        # Definition order: each attempt retries the step before it, or moves to the next live step,
        # unless an operator resumed the run at another step.
        cls = CLASSES[run.workflow_class]
        jumps = {e.step_id for e in events if e.kind == "resumed_at"}
        for previous, row in pairwise(rows):
            following = cls.next_step_after(previous.step_name)
            allowed = {previous.step_name, following.name if following else None}
            assert row.step_name in allowed or row.pk in jumps, f"{run}: {previous} then {row}"
        attempts: dict[str, list[int]] = defaultdict(list)
        for row in rows:
            attempts[row.step_name].append(row.attempt)
        for name, numbers in attempts.items():
            assert numbers == list(range(1, len(numbers) + 1)), f"{run}: attempts of {name} are {numbers}"

        # max_reattempts: at most two error reattempts in a row of one step.
        by_name: dict[str, list[WorkflowStep]] = defaultdict(list)
        for row in rows:
            by_name[row.step_name].append(row)
        for name, attempts in by_name.items():
            streak = 0
            for row in attempts:
                if row.outcome != "reattempted":
                    streak = 0
                elif row.reattempt_reason in ERROR_REASONS:
                    streak += 1
                    assert streak <= MAX_REATTEMPTS, f"{run}: {name} reattempted {streak} times in a row"

        run_signals = [s for s in signals if s.run_id == run.pk]
        received = [e for e in events if e.kind == "signal_received"]
        consumed_events = [e for e in events if e.kind == "signal_consumed"]
        # A signal that woke an attempt whose body then never ran went back to pending.
        returned_events = [e for e in events if e.kind == "signal_returned"]
        assert len(received) == len(run_signals), f"{run}: {len(received)} signal_received, {len(run_signals)} rows"
        consumed_now = len([s for s in run_signals if s.status == "consumed"])
        assert len(consumed_events) - len(returned_events) == consumed_now, (run, consumed_events, returned_events)
        for event in returned_events:
            attempt = steps_by_pk[event.step_id]
            assert attempt.signal_id is None and attempt.status not in ("completed", "in_progress"), attempt

    # Signals: consumed once, by one step of their run that waits for that name, oldest first.
    consumers = Counter(s.consumed_by_id for s in signals if s.consumed_by_id is not None)
    assert all(n == 1 for n in consumers.values()), f"a step consumed two signals: {consumers}"
    for signal in signals:
        consumed = signal.status == "consumed"
        assert consumed == (signal.consumed_by_id is not None) == (signal.consumed_at is not None), signal
        if not consumed:
            continue
        consumer = steps_by_pk[signal.consumed_by_id]
        assert consumer.run_id == signal.run_id
        assert consumer.signal_id == signal.pk, f"{signal} consumed by {consumer}, which holds {consumer.signal_id}"
        cls = CLASSES[consumer.run.workflow_class]
        names = cls.step_definition(consumer.step_name).wait_for
        assert signal.name in names, f"{consumer.step_name} waits for {names}, consumed {signal.name}"
        older = [
            s
            for s in signals
            if s.run_id == signal.run_id
            and s.status == "pending"
            and s.name in names
            and (s.received_at, s.pk) < (signal.received_at, signal.pk)
        ]
        assert not older, f"{signal} consumed while older {older} stay pending"
    for row in steps_by_pk.values():
        if row.signal_id is None:
            continue
        signal = next(s for s in signals if s.pk == row.signal_id)
        consumer = steps_by_pk[signal.consumed_by_id]
        # A retry of a wait_for attempt keeps the signal its first attempt consumed.
        assert (row.run_id, row.step_name) == (consumer.run_id, consumer.step_name), f"{row} holds {signal}"

    # Bodies: each attempt ran at most once, always after its claim; a completed attempt's body ran.
    ran = Counter(SideEffect.objects.filter(label="sm-ran").values_list("key", flat=True))
    assert all(n == 1 for n in ran.values()), f"an attempt's body ran twice: {ran}"
    violations = list(SideEffect.objects.filter(label="sm-violation").values_list("key", flat=True))
    assert not violations, violations
    for row in steps_by_pk.values():
        key = f"{row.run.workflow_id}:{row.step_name}:{row.attempt}"
        if row.status == "completed":
            assert key in ran, f"{row} completed, but its body never ran"
        if key in ran:
            assert row.started_at is not None, f"{row}: the body ran but the attempt was never claimed"
            assert row.status not in ("scheduled",), f"{row}: the body ran, and the attempt is scheduled again"


def check_waits_expired(now: Any, held: list[int]) -> None:
    """Every wait of a waiting run past its deadline timed out; a paused run's wait did not."""
    late = WorkflowStep.objects.filter(status="waiting", run__status="waiting", timeout_at__lt=now)
    assert not late.exists(), f"waits past their timeout_at: {list(late)}"
    kept = WorkflowStep.objects.filter(pk__in=held, status="waiting").count()
    assert kept == len(held), "a paused run's wait timed out"


# -- the machine -------------------------------------------------------------------------------------

STEP_NAMES = [*sorted({d.name for cls in CLASSES.values() for d in cls.step_definitions()}), "nope"]


class WorkflowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")
        self.orders = [Order.objects.create(), Order.objects.create()]
        #: Claimed attempts whose body has not run yet (their run is performing, or paused).
        self.in_flight: list[WorkflowStep] = []

    @initialize(
        runs=st.lists(
            st.tuples(st.sampled_from(sorted(CLASSES)), st.sampled_from([0, 1, None]), PLAN), min_size=1, max_size=3
        )
    )
    def seed(self, runs: list[tuple[str, int | None, str]]) -> None:
        """Every example begins with a few runs (Hypothesis may turn the start rule off for a whole example)."""
        for name, subject, plan in runs:
            order = None if subject is None else self.orders[subject]
            try:
                CLASSES[name].start(order, plan=plan)
            except AlreadyRunning:
                pass

    def pick(self, index: int) -> WorkflowRun | None:
        runs = list(WorkflowRun.objects.order_by("pk"))
        return runs[index % len(runs)] if runs else None

    # -- starting ---------------------------------------------------------------------------------

    @rule(
        name=st.sampled_from(sorted(CLASSES)),
        subject=st.sampled_from([0, 1, None]),
        key=st.sampled_from([None, None, "k1", "k2"]),
        plan=PLAN,
    )
    @precondition(lambda self: WorkflowRun.objects.count() < MAX_RUNS)
    def start(self, name: str, subject: int | None, key: str | None, plan: str) -> None:
        cls = CLASSES[name]
        order = None if subject is None else self.orders[subject]
        first_with_key = WorkflowRun.objects.filter(workflow_class=name, idempotency_key=key).first() if key else None
        holder = None
        if order is not None:
            holder = (
                WorkflowRun.objects.ongoing()
                .filter(workflow_class=name, subject_type="testapp.order", subject_id=str(order.pk))
                .first()
            )
        before = every_workflow_row()
        same_start = first_with_key is not None and (
            (first_with_key.subject_id, first_with_key.arguments)
            == (None if order is None else str(order.pk), {"plan": plan})
        )
        if first_with_key is not None and same_start:
            wf = cls.start(order, idempotency_key=key, plan=plan)
            assert wf.duplicate_start and wf.workflow_id == first_with_key.workflow_id
            assert every_workflow_row() == before
        elif first_with_key is not None:  # the key holds another start: refused, nothing written
            with pytest.raises(IdempotencyConflict, match="nothing was started"):
                cls.start(order, idempotency_key=key, plan=plan)
            assert every_workflow_row() == before
        elif holder is not None:
            with pytest.raises(AlreadyRunning, match="already has an ongoing run") as caught:
                cls.start(order, idempotency_key=key, plan=plan)
            assert caught.value.workflow.workflow_id == holder.workflow_id
            assert every_workflow_row() == before
        else:
            wf = cls.start(order, idempotency_key=key, plan=plan)
            assert not wf.duplicate_start
            assert wf.reload().status == "ready"
            assert [s.step_name for s in wf.steps] == [cls.step_definitions()[0].name]

    @rule(index=st.integers(0, MAX_RUNS - 1), plan=PLAN)
    def set_plan(self, index: int, plan: str) -> None:
        run = self.pick(index)
        if run is not None:
            SideEffect.objects.create(label=f"sm-plan:{run.workflow_id}", key=plan)

    # -- running steps ------------------------------------------------------------------------------

    @rule(rounds=st.integers(1, 3), ignore_wait=st.booleans())
    def execute_due(self, rounds: int, ignore_wait: bool) -> None:
        """What a dispatcher does; or, ignoring ``wait``, claim every scheduled step of a ready run."""
        for _ in range(rounds):
            if ignore_wait:
                scheduled = WorkflowStep.objects.filter(status="scheduled", run__status="ready").order_by("pk")
                pks = list(scheduled.values_list("pk", flat=True))
                claimed = [c for c in (claim_step(pk, claimed_by="sm") for pk in pks) if c is not None]
            else:
                claimed = claim_due_steps(20, claimed_by="sm")
            for row in claimed:
                execute_step(row)

    @rule(index=st.integers(0, MAX_RUNS - 1), keep=st.booleans())
    def claim_one(self, index: int, keep: bool) -> None:
        """Claim the run's scheduled step whatever its time; run it now, or leave it in progress."""
        run = self.pick(index)
        if run is None:
            return
        scheduled = WorkflowStep.objects.filter(run=run, status="scheduled").first()
        if scheduled is None:
            return
        before = every_workflow_row()
        claimed = claim_step(scheduled.pk, claimed_by="sm")
        if run.status != "ready":
            assert claimed is None and every_workflow_row() == before, "claimed the step of a run that is not ready"
            return
        assert claimed is not None
        if keep:
            self.in_flight.append(claimed)
        else:
            execute_step(claimed)

    @rule(data=st.data())
    def finish_in_flight(self, data: st.DataObject) -> None:
        if not self.in_flight:
            return
        claimed = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        execute_step(claimed)

    # -- operators ------------------------------------------------------------------------------------

    @rule(
        index=st.integers(0, MAX_RUNS - 1),
        verb=st.sampled_from(["pause", "resume", "resume_at", "cancel", "rerun", "run_now", "skip"]),
        step_name=st.sampled_from(STEP_NAMES),
    )
    def operate(self, index: int, verb: str, step_name: str) -> None:
        run = self.pick(index)
        if run is not None:
            self.apply_verb(run, verb, step_name)

    @rule(
        data=st.data(),
        verb=st.sampled_from(["pause", "resume", "cancel", "run_now", "skip", "signal"]),
    )
    def operate_in_flight(self, data: st.DataObject, verb: str) -> None:
        """A verb (or a signal) on the run of a claimed attempt whose body has not run yet."""
        if not self.in_flight:
            return
        claimed = self.in_flight[data.draw(st.integers(0, len(self.in_flight) - 1))]
        run = WorkflowRun.objects.filter(pk=claimed.run_id).first()
        if run is None:
            return  # deleted by the retention cleanup
        if verb == "signal":
            self.deliver(run, data.draw(st.sampled_from(["go", "alt"])), None, via_subject=False)
        else:
            self.apply_verb(run, verb, "first")

    def apply_verb(self, run: WorkflowRun, verb: str, step_name: str) -> None:
        cls = CLASSES[run.workflow_class]
        handle = Workflow.find(run.workflow_id)
        active = active_step(run)
        status = run.status
        now = timezone.now()
        refusal: type[Exception] | tuple[type[Exception], ...] = InvalidTransition
        # The one answer the admin's buttons use; the services must agree with it.
        allowed = verb in allowed_verbs(run, active, now)
        if verb in ("resume", "resume_at") and status != "paused":
            refusal = NotPaused
        if verb == "resume_at":
            allowed = allowed and cls.step_definition(step_name) is not None
            refusal = NotPaused if status != "paused" else StepNotDefined
        elif verb == "rerun":
            other = (
                WorkflowRun.objects.ongoing()
                .filter(workflow_class=run.workflow_class, subject_type=run.subject_type, subject_id=run.subject_id)
                .exclude(pk=run.pk)
                .exists()
            )
            allowed = allowed and not (run.subject_id and other)
            refusal = (InvalidTransition, AlreadyRunning)
        before = every_workflow_row()
        call = getattr(handle, verb)
        args = (step_name,) if verb == "resume_at" else ()
        if not allowed:
            with pytest.raises(refusal):
                call(*args, actor="sm-operator", reason="property test")
            assert every_workflow_row() == before, f"a refused {verb} on a {status} run changed rows"
            return
        last = WorkflowStep.objects.filter(run=run).order_by("-pk").first()
        result = call(*args, actor="sm-operator", reason="property test")
        run.refresh_from_db()
        after = active_step(run)
        if verb == "pause":
            assert (run.status, run.paused_reason) == ("paused", "property test")
        elif verb == "cancel":
            assert run.status == "cancelled" and after is None
        elif verb == "resume_at":
            assert run.status == "ready" and after.step_name == step_name
            assert after.scheduled_at <= timezone.now() + CLOCK_SLACK
        elif verb == "rerun":
            new = result.reload().record
            assert new.workflow_id != run.workflow_id and new.status == "ready" and new.rerun_of == run.workflow_id
            assert (new.subject_type, new.subject_id, new.arguments) == (
                run.subject_type,
                run.subject_id,
                run.arguments,
            )
        elif verb == "resume":
            # "a scheduled step keeps its time; a step that failed or paused runs again now"
            if active is not None:
                assert after is not None and after.pk == active.pk
                assert (after.status, after.scheduled_at) == (active.status, active.scheduled_at)
                assert (
                    run.status
                    == {"scheduled": "ready", "waiting": "waiting", "in_progress": "performing"}[after.status]
                )
            else:
                assert run.status == "ready" and after.step_name == last.step_name
                assert after.scheduled_at <= timezone.now() + CLOCK_SLACK
        elif verb == "run_now":
            assert after is not None and after.pk == active.pk and after.status == "scheduled"
            assert after.scheduled_at <= timezone.now() + CLOCK_SLACK
            if active.status == "waiting":
                assert after.timed_out
        elif verb == "skip":
            current = active or last
            skipped = WorkflowStep.objects.get(pk=current.pk)
            if active is not None:
                assert skipped.status == "skipped", f"skip left {skipped}"
            following = cls.next_step_after(current.step_name)
            if following is None:
                assert run.status == "finished" and after is None
            else:
                assert run.status == "ready" and after.step_name == following.name

    # -- signals and timeouts ---------------------------------------------------------------------------

    @rule(
        index=st.integers(0, MAX_RUNS - 1),
        name=st.sampled_from(["go", "alt", "noise"]),
        key=st.sampled_from([None, None, "s1", "s2"]),
        via_subject=st.booleans(),
    )
    def signal(self, index: int, name: str, key: str | None, via_subject: bool) -> None:
        run = self.pick(index)
        if run is not None:
            self.deliver(run, name, key, via_subject=via_subject)

    def deliver(self, run: WorkflowRun, name: str, key: str | None, *, via_subject: bool) -> None:
        cls = CLASSES[run.workflow_class]
        first = WorkflowSignal.objects.filter(run=run, idempotency_key=key).first() if key else None
        before = every_workflow_row()
        if name not in cls.signal_names():  # a name no step of the class waits for: refused, always
            order = Order.objects.filter(pk=run.subject_id).first() if run.subject_id else None
            with pytest.raises(UnknownSignal, match=f"No step of {run.workflow_class} waits for signal"):
                if via_subject and order is not None:
                    cls.signal_for(order, name, payload={"n": 1}, idempotency_key=key, missing="ignore")
                else:
                    Workflow.find(run.workflow_id).signal(name, {"n": 1}, idempotency_key=key)
            assert every_workflow_row() == before
            return
        if via_subject and run.subject_id:
            holder = WorkflowRun.objects.ongoing().filter(
                workflow_class=run.workflow_class, subject_type=run.subject_type, subject_id=run.subject_id
            )
            order = Order.objects.get(pk=run.subject_id)
            result = cls.signal_for(order, name, payload={"n": 1}, idempotency_key=key, missing="ignore")
            if not holder.exists():
                assert result is None and every_workflow_row() == before
            return  # the ongoing run of the subject may be another run than ``run``: the invariants judge
        handle = Workflow.find(run.workflow_id)
        if first is not None:
            result = handle.signal(name, {"n": 1}, idempotency_key=key)
            assert result.duplicate_delivery and result.pk == first.pk
            assert every_workflow_row() == before, "a duplicate delivery changed rows"
        elif run.status in TERMINAL_RUN:
            with pytest.raises(NotOngoing, match=f"Cannot signal a {run.status} workflow"):
                handle.signal(name, {"n": 1}, idempotency_key=key)
            assert every_workflow_row() == before
        else:
            active = active_step(run)
            waits = active is not None and active.status == "waiting" and name in (active.wait_for or [])
            result = handle.signal(name, {"n": 1}, idempotency_key=key)
            assert not result.duplicate_delivery
            result.refresh_from_db()
            assert result.status == ("consumed" if waits else "pending")
            if waits:
                assert result.consumed_by_id == active.pk
                active.refresh_from_db()
                assert active.status == "scheduled"

    @rule(offset=st.sampled_from([timedelta(minutes=10), timedelta(hours=2), timedelta(days=400)]))
    def expire_waits(self, offset: timedelta) -> None:
        now = timezone.now() + offset
        held = list(WorkflowStep.objects.filter(status="waiting", run__status="paused").values_list("pk", flat=True))
        expire_due_waits(now=now)
        check_waits_expired(now, held)

    @rule(offset=st.sampled_from([timedelta(0), timedelta(hours=2), timedelta(days=400)]))
    def sweep(self, offset: timedelta) -> None:
        now = timezone.now() + offset
        held = list(WorkflowStep.objects.filter(status="waiting", run__status="paused").values_list("pk", flat=True))
        summary = Sweeper().run(now=now)
        assert summary is not None and "failed" not in summary, summary
        check_waits_expired(now, held)
        assert not WorkflowStep.objects.filter(status="in_progress", stall_at__lt=now).exists(), "a stall was missed"
        old = WorkflowRun.objects.filter(status__in=TERMINAL_RUN, status_changed_at__lt=now - timedelta(days=30))
        assert not old.exists(), "the retention cleanup left old runs"

    @rule()
    def dispatcher_dies(self) -> None:
        """The dispatcher that claimed the in-flight attempts stops heartbeating; the sweep stalls them."""
        Dispatcher.objects.update_or_create(
            name="sm", defaults={"hostname": "sm", "pid": 1, "heartbeat_at": timezone.now() - timedelta(hours=1)}
        )
        summary = Sweeper().run()
        assert summary is not None and "failed" not in summary, summary
        assert not WorkflowStep.objects.filter(status="in_progress", claimed_by="sm").exists()
        assert not Dispatcher.objects.filter(name="sm").exists()

    # -- after every rule ----------------------------------------------------------------------------

    @invariant()
    def rows_are_consistent(self) -> None:
        check_invariants()


def test_random_interleavings_keep_every_invariant(transactional_db):
    run_state_machine_as_test(
        WorkflowMachine,
        settings=settings(
            max_examples=30,
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
