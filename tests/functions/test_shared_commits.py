"""A function's call that ends at its checkpoint when the worker has other work: outcomes written together.

A dispatcher's worker that holds other work tells the call so (``Chain.others_waiting``); the
call then runs one new checkpoint, goes on in memory to the next, and ends there with that
checkpoint as its outcome, which the worker writes with the others in one transaction. That
transaction claims the function's next row for the worker and hands it the recorded
checkpoints, so the next call replays them without a query. The rows, results and audit
trail are those of a function that commits each checkpoint on its own.

Driven here as a worker drives it: ``perform_step`` for each claimed row, then
``apply_outcomes`` for the batch, then the rows the batch chained; counted with Django's
``CaptureQueriesContext`` on PostgreSQL.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pgbus_workflows import OnException, StepFailed, durable
from pgbus_workflows.functions import ENTRY
from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.services.applying import apply_outcomes
from pgbus_workflows.services.chain import Chain
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import perform_step
from pgbus_workflows.states import RunStatus, StepOutcomeKind
from tests.functions.bodies import FAILING, effect
from tests.support import events_of, steps_of

pytestmark = pytest.mark.django_db(transaction=True)

#: How many times each checkpoint body ran, by ``(workflow_id, checkpoint)``.
CALLS: dict[tuple[str, str], int] = {}


def counted(ctx, name, value):
    """A checkpoint body that counts its calls and returns ``value``."""

    def body():
        key = (ctx.workflow_id, name)
        CALLS[key] = CALLS.get(key, 0) + 1
        return value

    return body


@durable(name="durable_shared_three", allow_multiple=True)
def three(ctx, n=0):
    a = ctx.step("a", counted(ctx, "a", n))
    b = ctx.step("b", counted(ctx, "b", a + 1))
    return [a, b, ctx.step("c", counted(ctx, "c", b + 1))]


@durable(name="durable_shared_three_async", allow_multiple=True)
async def three_async(ctx, n=0):
    a = await ctx.step("a", counted(ctx, "a", n))
    b = await ctx.step("b", counted(ctx, "b", a + 1))
    return [a, b, await ctx.step("c", counted(ctx, "c", b + 1))]


@durable(name="durable_shared_sleeper", allow_multiple=True)
def sleeper(ctx):
    first = ctx.step("first", counted(ctx, "first", 1))
    ctx.sleep("nap", 0)
    return first + ctx.step("second", counted(ctx, "second", 2))


@durable(name="durable_shared_failing", allow_multiple=True)
def failing_after_one(ctx):
    ctx.step("ok", counted(ctx, "ok", 1))
    return ctx.step("boom", effect("boom"), on_exception=OnException(action="pause"))


@durable(name="durable_shared_raising", allow_multiple=True)  # the default policy pauses
def raising_between(ctx, fail=True):
    value = ctx.step("first", counted(ctx, "first", 1))
    if fail:
        raise ValueError("the function's own code failed after a checkpoint")
    return value


@durable(name="durable_shared_raising_async", allow_multiple=True)
async def raising_between_async(ctx, fail=True):
    value = await ctx.step("first", counted(ctx, "first", 1))
    if fail:
        raise ValueError("the function's own code failed after a checkpoint")
    return value


@durable(name="durable_shared_waiter", allow_multiple=True)
def waiter(ctx):
    first = ctx.step("first", counted(ctx, "first", 1))
    payload = ctx.wait_for("go")
    second = ctx.step("second", counted(ctx, "second", payload["n"]))
    return [first, payload["n"], second, ctx.step("third", counted(ctx, "third", 3))]


@durable(name="durable_shared_compensating", allow_multiple=True)
def compensating(ctx):
    try:
        ctx.step("charge", effect("charge"), on_exception="raise")
    except StepFailed:
        ctx.step("refund", counted(ctx, "refund", "refunded"))
    return ctx.step("notify", counted(ctx, "notify", "sent"))


@durable(name="durable_shared_kid", allow_multiple=True)
def kid(ctx, base):
    return ctx.step("x", counted(ctx, "x", base)) + 1  # the result is not the last checkpoint's output


@durable(name="durable_shared_parent", allow_multiple=True)
def parent(ctx):
    return ctx.child("kid", kid, base=40) + ctx.step("after", counted(ctx, "after", 1))


def _commits(captured):
    return sum(1 for query in captured.captured_queries if query["sql"] == "COMMIT")


def _replay_reads(captured):
    """The queries that read a run's recorded checkpoints (``functions.checkpoints.latest_attempts``)."""
    return sum(1 for q in captured.captured_queries if q["sql"].startswith("SELECT") and '"outcome"' in q["sql"]
               and '"traceback"' not in q["sql"] and '"error_message"' in q["sql"])  # fmt: skip


def _work_as_a_busy_worker():
    """Claim every due row and run it as a worker with other work in hand, batch by batch, until none is left."""
    chain = Chain("worker", None, others_waiting=lambda: True)
    queue = claim_due_steps(100, None, "worker")
    batches = 0
    while queue:
        performed = [perform_step(step, chain=chain, verify=False) for step in queue]
        apply_outcomes([done for done in performed if isinstance(done, tuple)], chain)
        batches += 1
        queue = chain.take()
    return batches


@pytest.mark.parametrize("function", [three, three_async], ids=["def", "async def"])
def test_five_runs_of_three_checkpoints_are_three_shared_commits(function):
    CALLS.clear()
    runs = [function.start(None, n=n) for n in range(5)]
    with CaptureQueriesContext(connection) as captured:
        batches = _work_as_a_busy_worker()
    assert batches == 3  # a, b, then c with the run's end: one transaction each for all five runs
    assert _commits(captured) == 3
    # None: a first call's row was made with its run, and later calls were handed the checkpoints.
    assert _replay_reads(captured) == 0
    for n, run in enumerate(runs):
        assert run.reload().status == RunStatus.FINISHED
        assert run.result() == [n, n + 1, n + 2]
        rows = [(s.step_name, s.attempt, s.outcome, s.output) for s in steps_of(run)]
        assert rows == [
            ("a", 1, StepOutcomeKind.SUCCESS, n),
            ("b", 1, StepOutcomeKind.SUCCESS, n + 1),
            ("c", 1, StepOutcomeKind.SUCCESS, n + 2),
            (ENTRY, 1, StepOutcomeKind.SUCCESS, [n, n + 1, n + 2]),
        ]
    assert set(CALLS.values()) == {1}  # every body ran once
    assert len(CALLS) == 15


def test_the_audit_trail_is_a_three_step_workflows_and_the_result_is_on_the_functions_row():
    """Each checkpoint moves the run on and the next row is claimed; the last one finishes it, in one write."""
    run = three.start(None, n=1)
    _work_as_a_busy_worker()
    trail = [(e.kind, e.transition, e.step.step_name if e.step else None) for e in events_of(run)]
    assert trail == [
        ("started", "", None),
        ("step_started", "claim", "a"),  # an event names its row as the row is now: renamed by its checkpoint
        ("step_completed", "advance", "a"),
        ("step_started", "claim", "b"),
        ("step_completed", "advance", "b"),
        ("step_started", "claim", "c"),
        ("finished", "finish", ENTRY),
    ]
    finished = events_of(run, "finished")[0]
    assert finished.details["checkpoint"] == "c"
    assert [(s.step_name, s.status, s.output) for s in steps_of(run)] == [
        ("a", "completed", 1),
        ("b", "completed", 2),
        ("c", "completed", 3),
        (ENTRY, "completed", [1, 2, 3]),
    ]
    assert run.result() == [1, 2, 3]


def test_a_sleep_after_a_shared_checkpoint_parks_on_the_next_call():
    CALLS.clear()
    run = sleeper.start(None)
    _work_as_a_busy_worker()  # first, then the sleep of 0 parks; it is due at once and runs on
    _work_as_a_busy_worker()
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == 3
    assert [s.step_name for s in steps_of(run)] == ["first", "nap", "nap", "second", ENTRY]
    assert set(CALLS.values()) == {1}


def test_a_failing_checkpoint_after_a_shared_one_pauses_with_the_first_recorded():
    CALLS.clear()
    FAILING.add("boom")
    run = failing_after_one.start(None)
    _work_as_a_busy_worker()
    run.reload()
    assert run.status == RunStatus.PAUSED
    assert [(s.step_name, s.outcome) for s in steps_of(run)] == [
        ("ok", StepOutcomeKind.SUCCESS),
        ("boom", StepOutcomeKind.FAILED),
    ]
    FAILING.clear()
    run.resume()
    _work_as_a_busy_worker()
    assert run.reload().status == RunStatus.FINISHED
    assert CALLS[(str(run.record.workflow_id), "ok")] == 1


def test_a_run_paused_during_the_call_keeps_the_checkpoint_and_does_not_finish():
    """The function returned, but the run was paused meanwhile: its next row is held, the run stays paused."""
    run = three.start(None, n=0)
    chain = Chain("worker", None, others_waiting=lambda: True)
    queue = claim_due_steps(10, None, "worker")
    for _ in range(2):
        performed = [perform_step(step, chain=chain, verify=False) for step in queue]
        apply_outcomes([done for done in performed if isinstance(done, tuple)], chain)
        queue = chain.take()
    performed = [perform_step(step, chain=chain, verify=False) for step in queue]  # c ran, the function returned
    run.pause(actor="ops")
    apply_outcomes([done for done in performed if isinstance(done, tuple)], chain)
    run.reload()
    assert run.status == RunStatus.PAUSED
    assert [(s.step_name, s.status) for s in steps_of(run)][-2:] == [("c", "completed"), (ENTRY, "scheduled")]
    run.resume()
    _work_as_a_busy_worker()
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == [0, 1, 2]
    assert WorkflowStep.objects.filter(run_id=run.record.pk, step_name="c").count() == 1


@pytest.mark.parametrize("function", [raising_between, raising_between_async], ids=["def", "async def"])
def test_an_error_of_the_functions_own_after_a_checkpoint_keeps_the_checkpoint(function):
    """The checkpoint is recorded before the error is applied: resumed, the function does not run its body again."""
    CALLS.clear()
    run = function.start(None)
    _work_as_a_busy_worker()
    run.reload()
    assert run.status == RunStatus.PAUSED
    assert [(s.step_name, s.outcome) for s in steps_of(run)] == [
        ("first", StepOutcomeKind.SUCCESS),
        (ENTRY, StepOutcomeKind.FAILED),
    ]
    run.record.arguments = {"fail": False}  # the mend
    run.record.save(update_fields=["arguments"])
    run.resume()
    _work_as_a_busy_worker()
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == 1
    assert CALLS == {(str(run.record.workflow_id), "first"): 1}


@durable(name="durable_shared_long", allow_multiple=True)
def long_function(ctx, checkpoints):
    return sum(ctx.step("c", counted(ctx, f"c{n}", 1)) for n in range(checkpoints))


@durable(name="durable_shared_long_async", allow_multiple=True)
async def long_function_async(ctx, checkpoints):
    return sum([await ctx.step("c", counted(ctx, f"c{n}", 1)) for n in range(checkpoints)])


@pytest.mark.parametrize("function", [long_function, long_function_async], ids=["def", "async def"])
def test_past_the_shared_positions_a_function_goes_on_with_commits_of_its_own(monkeypatch, function):
    """Replaying from the top at every checkpoint of a long function would cost more than the commits it saves."""
    monkeypatch.setattr("pgbus_workflows.functions.context.SHARED_COMMITS_UP_TO", 5)
    CALLS.clear()
    run = function.start(None, checkpoints=8)
    with CaptureQueriesContext(connection) as captured:
        batches = _work_as_a_busy_worker()
    assert batches == 6  # a call for each of the first five; the sixth call runs the last three and returns
    assert _commits(captured) == 6 + 3  # the sixth to the eighth checkpoint commit on their own
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == 8
    assert set(CALLS.values()) == {1}
    assert len(CALLS) == 8


def test_a_checkpoint_recorded_on_its_own_in_the_call_is_handed_on_with_the_shared_one():
    """The payload is recorded as the woken call begins, then ``second`` is shared: the next call replays both."""
    CALLS.clear()
    run = waiter.start(None)
    _work_as_a_busy_worker()  # first, then the wait parks
    assert run.reload().status == RunStatus.WAITING
    run.signal("go", {"n": 2})
    _work_as_a_busy_worker()
    assert run.reload().status == RunStatus.FINISHED, run.record.paused_reason
    assert run.result() == [1, 2, 2, 3]
    assert [s.step_name for s in steps_of(run)] == ["first", "go", "second", "third", ENTRY]
    assert set(CALLS.values()) == {1}


def test_a_failure_raised_into_the_function_then_a_shared_checkpoint_reads_the_rows_next():
    """A failure recorded as it was raised is not in the call's replay: the next call reads the checkpoints."""
    CALLS.clear()
    FAILING.add("charge")
    run = compensating.start(None)
    _work_as_a_busy_worker()
    assert run.reload().status == RunStatus.FINISHED, run.record.paused_reason
    assert run.result() == "sent"
    assert [(s.step_name, s.outcome) for s in steps_of(run)] == [
        ("charge", StepOutcomeKind.FAILED),
        ("refund", StepOutcomeKind.SUCCESS),
        ("notify", StepOutcomeKind.SUCCESS),
        (ENTRY, StepOutcomeKind.SUCCESS),
    ]
    assert set(CALLS.values()) == {1}


def test_a_child_finished_in_its_checkpoints_write_hands_its_parent_the_functions_result():
    """The child's run ends on the row holding its return: its parent's job gets the return, not ``x``'s output."""
    CALLS.clear()
    run = parent.start(None)
    for _ in range(5):  # the parent parks on its child; the child's end wakes it
        _work_as_a_busy_worker()
        if run.reload().status == RunStatus.FINISHED:
            break
    assert run.reload().status == RunStatus.FINISHED, run.record.paused_reason
    assert run.result() == 42
    [child] = WorkflowRun.objects.filter(workflow_class="durable_shared_kid")
    assert kid.find(child.workflow_id).result() == 41
    assert events_of(kid.find(child.workflow_id), "finished")[0].details["checkpoint"] == "x"
