"""``async def`` durable functions: the same calls, awaited, with the same replay, records and errors.

The test helpers await the function on the calling thread (as they await async step bodies);
everything is asserted on the rows (steps, events, the side effects table).
"""

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.test import TransactionTestCase

from pgbus_workflows import ConfigurationError, OnException, StepFailed, durable
from pgbus_workflows.functions import ENTRY
from pgbus_workflows.models import WorkflowEvent, WorkflowStep
from pgbus_workflows.states import RunStatus, StepStatus
from pgbus_workflows.testing import StepWaiting, WorkflowTestMixin
from tests.functions.bodies import FlakyError, effect
from tests.support import labels, record, steps_of
from tests.testapp.jobs import square
from tests.testapp.models import Order, SideEffect

pytestmark = pytest.mark.django_db


def async_effect(label):
    """An ``async def`` checkpoint body: records ``label`` through the async ORM and returns it."""

    async def body():
        await SideEffect.objects.acreate(label=label)
        await asyncio.sleep(0)
        return label

    return body


def done_names(run):
    return [s.step_name for s in steps_of(run) if s.step_name != ENTRY]


@durable(name="async_pages", allow_multiple=True)
async def async_pages(ctx, count):
    total = await ctx.step("count", lambda: count)
    seen = [await ctx.step("page", async_effect(f"page {n}")) for n in range(total)]
    seen.append(await ctx.step("page", effect("plain page")))
    return {"pages": seen}


def test_a_loop_of_async_and_plain_bodies_records_each_checkpoint_once(helpers):
    run = async_pages.start(None, count=2)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"pages": ["page 0", "page 1", "plain page"]}
    assert done_names(run) == ["count", "page", "page#2", "page#3"]
    assert labels() == ["page 0", "page 1", "plain page"]


@durable(name="async_sleeper", allow_multiple=True)
async def async_sleeper(ctx):
    await ctx.step("before", async_effect("before"))
    await ctx.sleep("cool_down", timedelta(hours=1))
    return await ctx.step("after", effect("after"))


def test_a_sleep_parks_with_nothing_in_flight_and_the_replay_calls_no_body_again(helpers):
    run = async_sleeper.start(None)
    helpers.perform_next_step(run)
    assert run.reload().status == RunStatus.READY
    assert not WorkflowStep.objects.filter(run_id=run.record.pk, status=StepStatus.IN_PROGRESS).exists()
    parked = WorkflowStep.objects.get(run_id=run.record.pk, status=StepStatus.SCHEDULED)
    assert parked.step_name == "cool_down"
    assert timedelta(minutes=59) < parked.scheduled_at - parked.created_at <= timedelta(minutes=61)
    helpers.advance(timedelta(minutes=61))
    helpers.speedrun_workflow(run)
    assert run.result() == "after"
    assert labels() == ["before", "after"]  # "before" was replayed, not called again
    assert list(dict.fromkeys(done_names(run))) == ["before", "cool_down", "after"]  # the sleep: two attempts


@durable(name="async_payment", allow_multiple=True)
async def async_payment(ctx):
    await ctx.step("invoice", effect("invoice"))
    paid = await ctx.wait_for("payment", timeout=timedelta(days=2))
    return {"paid": paid}


def test_a_signal_wait_parks_until_the_signal_and_gives_its_payload(helpers):
    run = async_payment.start(None)
    with pytest.raises(StepWaiting):
        helpers.speedrun_workflow(run)
    assert not WorkflowStep.objects.filter(run_id=run.record.pk, status=StepStatus.IN_PROGRESS).exists()
    helpers.deliver_signal(run, "payment", {"amount": 10})
    helpers.speedrun_workflow(run)
    assert run.result() == {"paid": {"amount": 10}}
    assert labels() == ["invoice"]


def test_a_signal_wait_gives_none_at_its_timeout_on_the_virtual_clock(helpers):
    run = async_payment.start(None)
    with pytest.raises(StepWaiting):
        helpers.speedrun_workflow(run)
    helpers.advance(timedelta(days=3))
    helpers.speedrun_workflow(run)
    assert run.result() == {"paid": None}


@durable(name="async_compensates", allow_multiple=True)
async def async_compensates(ctx):
    async def charge():
        await SideEffect.objects.acreate(label="charge")
        raise FlakyError("card declined")

    try:
        await ctx.step("charge", charge, on_exception="raise")
    except StepFailed as failure:
        await ctx.step("refund", effect("refund"))
        await ctx.sleep("settle", timedelta(minutes=1))
        return {"failed": failure.step, "type": failure.exception_type, "message": failure.message}
    return "charged"


def test_a_failure_is_raised_into_the_function_once_and_again_on_the_replay(helpers):
    run = async_compensates.start(None)
    helpers.speedrun_workflow(run)
    assert run.result() == {"failed": "charge", "type": "tests.functions.bodies.FlakyError", "message": "card declined"}
    assert labels() == ["charge", "refund"]  # the replay after the sleep raised the recorded failure


@durable(name="async_pauses", allow_multiple=True)
async def async_pauses(ctx):
    async def flaky():
        await SideEffect.objects.acreate(label="try")
        if await SideEffect.objects.filter(label="try").acount() < 2:
            raise FlakyError("not yet")
        return "ok"

    return await ctx.step("flaky", flaky)


def test_a_failing_async_body_pauses_at_its_checkpoint_and_resume_runs_it_again(helpers):
    run = async_pauses.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    failed = WorkflowStep.objects.get(run_id=run.record.pk, step_name="flaky")
    assert (failed.error_class, failed.error_message) == ("tests.functions.bodies.FlakyError", "not yet")
    run.resume()
    helpers.speedrun_workflow(run)
    assert run.result() == "ok"


@durable(name="async_reattempts", allow_multiple=True)
async def async_reattempts(ctx):
    async def flaky():
        await SideEffect.objects.acreate(label="try")
        if await SideEffect.objects.filter(label="try").acount() < 3:
            raise FlakyError("not yet")
        return ctx.step_idempotency_key

    return await ctx.step("flaky", flaky, on_exception=OnException(FlakyError, action="reattempt", max_reattempts=5))


def test_a_reattempted_async_body_keeps_its_idempotency_key(helpers):
    run = async_reattempts.start(None)
    helpers.speedrun_workflow(run)  # runs each reattempt at once
    assert run.result() == f"{run.workflow_id}:flaky"
    assert labels().count("try") == 3


def test_a_replay_that_meets_another_name_pauses_the_run_as_non_deterministic(helpers):
    order = ["first"]

    @durable(name="async_drifts", allow_multiple=True)
    async def drifts(ctx):
        await ctx.step(order[0], effect(order[0]))
        await ctx.sleep("nap", timedelta(minutes=1))
        return "done"

    run = drifts.start(None)
    helpers.perform_next_step(run)  # "first", then the nap parks the run
    order[0] = "second"
    helpers.advance(timedelta(minutes=2))
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    paused = WorkflowStep.objects.filter(run_id=run.record.pk, error_class__endswith="NonDeterministicRun").get()
    assert "'second' was reached where the run recorded 'first'" in paused.error_message
    assert labels() == ["first"]


def test_an_async_body_with_atomic_is_refused_with_a_clear_error(helpers):
    @durable(name="async_atomic_refused", allow_multiple=True)
    async def refused(ctx):
        return await ctx.step("write", async_effect("never"), atomic=True)

    run = refused.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    assert WorkflowEvent.objects.filter(run_id=run.record.pk, details__error_class__endswith="ConfigurationError")
    assert labels() == []


#: The attempts of ``async_atomic``'s body (outside the database: its rows roll back).
ATOMIC_TRIES = []


@durable(name="async_atomic", allow_multiple=True)
async def async_atomic(ctx):
    def write():
        ATOMIC_TRIES.append(1)
        record("written")
        if len(ATOMIC_TRIES) == 1:
            raise FlakyError("roll back")
        return "ok"

    policy = OnException(FlakyError, action="reattempt", max_reattempts=2)
    return await ctx.step("write", write, atomic=True, on_exception=policy)


def test_a_plain_atomic_body_commits_with_its_checkpoint_or_rolls_back(helpers):
    ATOMIC_TRIES.clear()
    run = async_atomic.start(None)
    helpers.speedrun_workflow(run)
    assert run.result() == "ok"
    assert len(ATOMIC_TRIES) == 2
    assert labels() == ["written"]  # the failed attempt's write rolled back with it


@durable(name="async_side_by_side", allow_multiple=True)
async def async_side_by_side(ctx):
    return await asyncio.gather(ctx.step("a", async_effect("a")), ctx.step("b", async_effect("b")))


def test_calls_awaited_side_by_side_are_refused(helpers):
    run = async_side_by_side.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    step = WorkflowStep.objects.filter(run_id=run.record.pk, error_class__endswith="ConfigurationError").get()
    assert "one at a time" in step.error_message


@durable(name="async_timed", allow_multiple=True)
async def async_timed(ctx):
    async def slow():
        await SideEffect.objects.acreate(label="slow")
        await asyncio.sleep(30)

    return await ctx.step("slow", slow, timeout=timedelta(seconds=0.2))


def test_an_async_body_past_its_timeout_is_cancelled_and_its_attempt_stalls(helpers):
    run = async_timed.start(None)
    helpers.perform_next_step(run)
    stalled = WorkflowStep.objects.get(run_id=run.record.pk, step_name="slow", attempt=1)
    assert stalled.outcome == "stalled"
    assert labels() == ["slow"]


@durable(name="async_map_child", allow_multiple=True)
async def async_map_child(ctx, numbers):
    squares = await ctx.map("squares", square, numbers)
    paged = await ctx.child("pages", async_pages, None, count=1)
    return {"squares": squares, "pages": paged["pages"]}


def test_a_map_and_a_child_park_and_give_their_results(helpers):
    run = async_map_child.start(None, numbers=[1, 2, 3])
    for _ in range(2):
        with pytest.raises(StepWaiting):
            helpers.speedrun_workflow(run)
        helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.result() == {"squares": [1, 4, 9], "pages": ["page 0", "plain page"]}


class AsyncHelperTests(WorkflowTestMixin, TransactionTestCase):
    """The helpers, awaited from an async test (Django runs ``async def`` test methods on its own loop)."""

    async def test_the_async_helpers_run_an_async_function(self):
        run = await async_sleeper.astart(None)
        await self.aperform_next_step(run)
        await self.aadvance(timedelta(hours=2))
        await self.aspeedrun_workflow(run)
        self.assertEqual(await run.aresult(), "after")
        self.assertEqual(await sync_to_async(labels)(), ["before", "after"])


def test_refused_options_are_a_configuration_error_at_the_call(helpers):
    @durable(name="async_bad_option", allow_multiple=True)
    async def bad(ctx):
        return await ctx.step("x", lambda: 1, retries=3)

    run = bad.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    assert WorkflowStep.objects.filter(run_id=run.record.pk, error_class__endswith="ConfigurationError").exists()
    with pytest.raises(ConfigurationError):
        durable(name="x", retries=1)


@durable(name="async_reads", allow_multiple=True)
async def async_reads(ctx, query_outside):
    status = ctx.subject.status  # read before the function started: no query on the loop
    if query_outside:
        Order.objects.count()  # a plain query on the loop, outside any checkpoint
    return await ctx.step("count", lambda: [status, Order.objects.count()])


def test_the_subject_is_there_and_a_plain_query_outside_a_checkpoint_fails_the_attempt(helpers):
    order = Order.objects.create(status="paid")
    fine, refused = async_reads.start(order, query_outside=False), async_reads.start(order, query_outside=True)
    helpers.speedrun_workflow(fine)
    helpers.speedrun_workflow(refused)
    assert fine.result() == ["paid", 1]
    assert refused.reload().status == RunStatus.PAUSED
    [attempt] = WorkflowStep.objects.filter(run_id=refused.record.pk)
    assert attempt.error_class == "django.core.exceptions.SynchronousOnlyOperation"
