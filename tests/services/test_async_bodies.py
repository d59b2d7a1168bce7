"""``async def`` step bodies and fan-out jobs: awaited on the worker, with everything a plain body has."""

import asyncio
from datetime import timedelta

import pytest
from django.test import TransactionTestCase

from pgbus_workflows import Job, OnException, StepWaiting, Workflow, fan_out, step
from pgbus_workflows.models import FanOutJob, WorkflowStep
from pgbus_workflows.testing import WorkflowTestMixin
from tests.testapp.jobs import async_square
from tests.testapp.models import Order, SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

helpers = WorkflowTestMixin()


class AsyncOrder(Workflow):
    """Awaits the async ORM and reads what a plain body reads."""

    name = "async_bodies_order"
    exception_policies = [OnException(ConnectionError, action="reattempt", max_reattempts=1, wait=0)]

    @step
    async def fetch(self):
        await asyncio.sleep(0)
        order = await Order.objects.aget(pk=self.subject.pk)
        await SideEffect.objects.acreate(label="async-fetch", key=self.step_idempotency_key)
        return {"status": order.status, "subject": self.subject.pk, "attempt": self.attempt}

    @step
    async def flaky(self):
        if self.attempt == 1:
            raise ConnectionError("the API answered 503")
        return {"previous": self.outputs["fetch"]["status"]}

    @step(wait_for="approved")
    async def approve(self):
        return {"by": self.received_signal.payload["by"]}

    @step
    async def decide(self):
        if self.arguments.get("cancel"):
            self.cancel("no longer wanted")
        return "decided"


class AsyncFanOut(Workflow):
    name = "async_bodies_fan_out"

    @fan_out
    async def spread(self):
        await asyncio.sleep(0)
        return [Job(async_square, n) for n in range(3)]

    @step
    def total(self):
        return sum(self.fan_out_results("spread"))


def test_an_async_body_awaits_the_orm_and_reads_the_subject_outputs_signal_and_attempt():
    order = Order.objects.create(status="paid")
    wf = AsyncOrder.start(order)

    with pytest.raises(StepWaiting):
        helpers.speedrun_workflow(wf)  # fetch, flaky (twice), then approve waits
    helpers.deliver_signal(wf, "approved", {"by": "alice"})
    helpers.speedrun_workflow(wf)

    assert wf.reload().status == "finished"
    outputs = wf.outputs
    assert outputs["fetch"] == {"status": "paid", "subject": order.pk, "attempt": 1}
    assert outputs["flaky"] == {"previous": "paid"}
    assert outputs["approve"] == {"by": "alice"}
    assert outputs["decide"] == "decided"
    [key] = SideEffect.objects.filter(label="async-fetch").values_list("key", flat=True)
    assert key == f"{wf.workflow_id}:fetch"
    flaky = WorkflowStep.objects.filter(run=wf.record, step_name="flaky").order_by("attempt")
    assert [(s.attempt, s.status, s.error_class) for s in flaky] == [
        (1, "failed", "ConnectionError"),
        (2, "completed", ""),
    ]


def test_a_verb_in_an_async_body_ends_the_attempt_as_in_a_plain_one():
    wf = AsyncOrder.start(Order.objects.create(), cancel=True)
    with pytest.raises(StepWaiting):
        helpers.speedrun_workflow(wf)
    helpers.deliver_signal(wf, "approved", {"by": "bob"})
    helpers.speedrun_workflow(wf)

    assert wf.reload().status == "cancelled"
    assert wf.record.events.filter(kind="cancelled", reason="no longer wanted").exists()


def test_an_async_fan_out_body_and_async_jobs_run_and_their_results_come_back():
    wf = AsyncFanOut.start()

    with pytest.raises(StepWaiting):
        helpers.speedrun_workflow(wf)
    helpers.complete_fan_out(wf)
    helpers.speedrun_workflow(wf)

    assert wf.reload().status == "finished"
    assert wf.outputs["total"] == 0 + 1 + 4
    assert sorted(FanOutJob.objects.filter(run=wf.record).values_list("result", flat=True)) == [0, 1, 4]
    assert sorted(SideEffect.objects.filter(label="async_square").values_list("key", flat=True)) == ["0", "1", "2"]


class AsyncSyncQuery(Workflow):
    name = "async_bodies_sync_query"

    @step
    async def query(self):
        return Order.objects.count()  # a sync query inside the coroutine


def test_a_sync_query_inside_an_async_body_fails_the_attempt_with_djangos_error():
    wf = AsyncSyncQuery.start()

    helpers.speedrun_workflow(wf)

    [attempt] = WorkflowStep.objects.filter(run=wf.record)
    assert attempt.error_class == "django.core.exceptions.SynchronousOnlyOperation"
    assert wf.reload().status == "paused"


class AsyncHelperTests(WorkflowTestMixin, TransactionTestCase):
    """The helpers, awaited from an async test (Django runs ``async def`` test methods on its own loop)."""

    async def test_async_bodies_run_inline_from_an_async_test(self):
        order = await Order.objects.acreate(status="new")
        wf = await AsyncOrder.astart(order)

        with pytest.raises(StepWaiting):
            await self.aspeedrun_workflow(wf)
        await self.adeliver_signal(wf, "approved", {"by": "carol"})
        await self.aspeedrun_workflow(wf)

        self.assertEqual(wf.status, "finished")
        fan = await AsyncFanOut.astart()
        await self.aperform_next_step(fan)  # spread opens its jobs and waits for them
        self.assertEqual(fan.status, "waiting")
        await self.acomplete_fan_out(fan)
        await self.arun_step_inline(fan, "total")
        self.assertEqual(fan.status, "finished")


class AsyncSlow(Workflow):
    """An async body that outlives its timeout on its first attempt (cancelled), and one that raises TimeoutError."""

    name = "async_bodies_slow"

    @step(timeout=timedelta(seconds=0.2))
    async def call(self):
        try:
            await asyncio.sleep(30 if self.attempt == 1 else 0)
        except asyncio.CancelledError:
            await SideEffect.objects.acreate(label="async-cancelled", key=str(self.attempt))
            raise
        return "answered"

    @step
    async def own_timeout(self):
        raise TimeoutError("the API's own client timed out")


def test_an_async_body_past_its_timeout_is_cancelled_and_its_attempt_stalls():
    wf = AsyncSlow.start()

    helpers.speedrun_workflow(wf)

    attempts = list(WorkflowStep.objects.filter(run=wf.record).order_by("pk"))
    first = attempts[0]
    assert (first.step_name, first.outcome, first.error_class) == (
        "call",
        "stalled",
        "pgbus_workflows.exceptions.StepStalled",
    )
    assert first.error_message.endswith("stalled: timeout")
    event = wf.record.events.get(kind="step_stalled", step=first)
    assert event.details["detection"] == "timeout"
    assert "BodyTimedOut: cancelled after its timeout of 0:00:00.200000" in event.details["cause"]
    assert list(SideEffect.objects.filter(label="async-cancelled").values_list("key", flat=True)) == ["1"]
    assert (attempts[1].step_name, attempts[1].status, attempts[1].output) == ("call", "completed", "answered")
    # A TimeoutError the body raises itself is its error, for its policy (the default pauses).
    assert (attempts[2].step_name, attempts[2].error_class) == ("own_timeout", "TimeoutError")
    assert wf.reload().status == "paused"


def test_from_a_sync_test_a_module_level_client_is_made_anew_between_helper_calls():
    from tests.testapp.async_workflows import SHARED_CLIENT, EchoServer, UsesSharedClient

    SHARED_CLIENT.forget()
    with EchoServer() as server:
        first = UsesSharedClient.start(n=1, port=server.port)
        assert helpers.perform_next_step(first).reload().outputs["call"] == "1"
        # The next call awaits on a loop of its own: the client belongs to the closed one.
        second = UsesSharedClient.start(n=2, port=server.port)
        helpers.perform_next_step(second)
        assert WorkflowStep.objects.get(run=second.record).outcome != "success"
        SHARED_CLIENT.forget()  # set back to None between calls
        third = UsesSharedClient.start(n=3, port=server.port)
        assert helpers.perform_next_step(third).reload().outputs["call"] == "3"
    SHARED_CLIENT.forget()
