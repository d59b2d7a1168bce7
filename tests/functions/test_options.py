"""A checkpoint's step options: queue, priority and limits reroute its attempt; timeout; atomic.

Each behaviour is its own ``@durable`` class; runs move with the test helpers or the
PostgreSQL claim (``run_due_steps``), and the rows (steps, events, side effects) are asserted.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from pgbus_workflows import Concurrency, OnException, RateLimit, durable
from pgbus_workflows.conf import settings
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.executor import run_due_steps
from pgbus_workflows.states import RunStatus, StepOutcomeKind, StepStatus
from tests.support import events_of, labels, record, steps_of

pytestmark = pytest.mark.django_db

#: What bodies of this file noted about the rows while they ran.
SEEN: dict[str, object] = {}
#: Bodies (``writer``) that fail once while their label is here.
FAILING: set[str] = set()


class FlakyError(Exception):
    """Raised by checkpoint bodies of this file on purpose."""


def effect(label):
    """A checkpoint body: records ``label`` and returns it."""

    def body():
        record(label)
        return label

    return body


@pytest.fixture(autouse=True)
def _nothing_seen():
    SEEN.clear()
    FAILING.clear()
    yield
    SEEN.clear()
    FAILING.clear()


@durable(name="durable_routed", allow_multiple=True)
def routed(ctx):
    here = ctx.step("here", effect("here"))
    there = ctx.step("there", effect("there"), queue="slow", priority=-5)
    return [here, there]


def test_a_checkpoint_of_another_queue_is_rerouted_and_claimed_there():
    run = routed.start(None)
    assert run_due_steps(queues=[settings.DEFAULT_QUEUE]) == 1
    assert labels() == ["here"]  # "there" was reached on the default queue's row, not run there
    there = WorkflowStep.objects.get(run_id=run.record.pk, step_name="there")
    assert (there.status, there.queue, there.priority, there.attempt) == (StepStatus.SCHEDULED, "slow", -5, 1)
    assert run.reload().status == RunStatus.READY
    (rerouted,) = events_of(run, "step_rerouted")
    assert rerouted.details["to"] == {"queue": "slow", "priority": -5, "limiters": []}
    assert rerouted.details["from"]["queue"] == settings.DEFAULT_QUEUE
    assert run_due_steps(queues=[settings.DEFAULT_QUEUE]) == 0  # only the slow queue's dispatchers take it
    run_due_steps(queues=["slow"])
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == ["here", "there"]
    assert labels() == ["here", "there"]  # "here" was replayed, not run again


def test_a_checkpoint_with_the_rows_route_runs_on_it_without_a_reroute(helpers):
    @durable(name="durable_same_route", allow_multiple=True, step_options={"queue": "slow"})
    def same_route(ctx):
        return ctx.step("there", effect("there"), queue="slow")

    run = same_route.start(None)
    run_due_steps(queues=["slow"])
    assert run.reload().status == RunStatus.FINISHED
    assert not events_of(run, "step_rerouted")


def holding(ctx, nested):
    """A body that, while it holds the checkpoint's slot, starts another run and lets the dispatcher claim."""

    def body():
        record(f"limited {ctx.workflow_id}")
        if nested:
            other = limited.start(None)
            SEEN["other"] = str(other.workflow_id)
            run_due_steps()  # the other run reaches the checkpoint, is rerouted under its key, and waits
            row = WorkflowStep.objects.get(run_id=other.record.pk, step_name="limited")
            SEEN["waiting"] = (row.status, row.limiters)
        return "ok"

    return body


@durable(name="durable_limited", allow_multiple=True)
def limited(ctx, nested=False):
    ctx.step("free", effect("free"))
    return ctx.step("limited", holding(ctx, nested), concurrency=Concurrency(key="shared-key", limit=1))


def test_a_checkpoints_concurrency_is_claimed_under_its_key_across_runs():
    first = limited.start(None, nested=True)
    run_due_steps()  # the first, then the second once the first gave its slot back
    assert first.reload().status == RunStatus.FINISHED
    assert SEEN["waiting"] == (StepStatus.SCHEDULED, ["concurrency:shared-key"])  # its slot was the first's
    second = limited.find(SEEN["other"])
    assert second.status == RunStatus.FINISHED
    assert labels() == ["free", f"limited {first.workflow_id}", "free", f"limited {second.workflow_id}"]


@durable(name="durable_timed", allow_multiple=True)
def timed(ctx):
    def body():
        SEEN["row"] = WorkflowStep.objects.get(run__workflow_id=ctx.workflow_id, status=StepStatus.IN_PROGRESS)
        SEEN["now"] = timezone.now()
        return "ok"

    return ctx.step("bounded", body, timeout=timedelta(seconds=30))


def test_a_checkpoints_timeout_bounds_its_attempt(helpers):
    run = timed.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    row = SEEN["row"]
    assert row.step_name == "bounded"
    assert row.timeout == timedelta(seconds=30)
    assert row.stall_at <= SEEN["now"] + timedelta(seconds=30)  # the sweep stalls it past then


def writer(label):
    """A checkpoint body that writes ``label``, then raises while ``label`` is in FAILING (once)."""

    def body():
        record(label)
        if label in FAILING:
            FAILING.discard(label)
            raise FlakyError(label)
        return label

    return body


REATTEMPT = OnException(FlakyError, action="reattempt", max_reattempts=1)


@durable(name="durable_atomic", allow_multiple=True)
def atomic_writes(ctx):
    return [
        ctx.step("loose", writer("loose"), on_exception=REATTEMPT),
        ctx.step("exact", writer("exact"), on_exception=REATTEMPT, atomic=True),
    ]


def test_an_atomic_checkpoints_writes_commit_with_its_output_or_not_at_all(helpers):
    FAILING.update({"loose", "exact"})
    run = atomic_writes.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == ["loose", "exact"]
    # The failed attempt of "loose" kept its write; the failed attempt of "exact" was rolled back.
    assert labels() == ["loose", "loose", "exact"]
    exact = [s.outcome for s in steps_of(run) if s.step_name == "exact"]
    assert exact == [StepOutcomeKind.REATTEMPTED, StepOutcomeKind.SUCCESS]


@durable(name="durable_rated", allow_multiple=True)
def rated(ctx):
    return ctx.step("call", effect("call"), rate_limit=RateLimit(key="api", limit=1, per=timedelta(hours=1)))


def test_a_checkpoints_rate_limit_is_claimed_under_its_key():
    first, second = rated.start(None), rated.start(None)
    run_due_steps()
    assert first.reload().status == RunStatus.FINISHED
    assert second.reload().status == RunStatus.READY  # rerouted under the key, and no token left this hour
    waiting = WorkflowStep.objects.get(run_id=second.record.pk, step_name="call")
    assert (waiting.status, waiting.limiters) == (StepStatus.SCHEDULED, ["rate:api"])
    assert labels() == ["call"]


@durable(name="durable_reattempting", allow_multiple=True)
def reattempting(ctx):
    return ctx.step("call", writer("call"), on_exception="reattempt", max_reattempts=1)


def test_reattempt_with_max_reattempts_runs_the_checkpoint_again_then_pauses(helpers):
    FAILING.add("call")
    run = reattempting.start(None)
    helpers.perform_next_step(run)
    FAILING.add("call")  # the body fails once per add
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    call = [s.outcome for s in steps_of(run) if s.step_name == "call"]
    assert call == [StepOutcomeKind.REATTEMPTED, StepOutcomeKind.FAILED]


@durable(name="durable_routed_retry", allow_multiple=True)
def routed_retry(ctx):
    return ctx.step("there", writer("there"), queue="slow", priority=3, on_exception=REATTEMPT)


def test_a_rerouted_checkpoints_reattempt_keeps_its_queue_and_priority():
    FAILING.add("there")
    run = routed_retry.start(None)
    run_due_steps()
    assert run.reload().status == RunStatus.FINISHED
    there = [(s.attempt, s.queue, s.priority) for s in steps_of(run) if s.step_name == "there"]
    assert there == [(1, "slow", 3), (2, "slow", 3)]
    assert len(events_of(run, "step_rerouted")) == 1  # the reattempt was scheduled there: no second reroute
