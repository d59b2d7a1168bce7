"""The async API: ``astart``, ``afind``, ``asignal``, ``asignal_for``, ``aresult``, as their sync twins."""

import json
import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import AsyncClient, override_settings

from pgbus_workflows import AlreadyRunning, NotOngoing, UnknownSignal
from pgbus_workflows.models import WorkflowRun, WorkflowSignal
from pgbus_workflows.testing import WorkflowTestMixin
from tests.testapp.models import Order
from tests.testapp.workflows import Approval, NoOp1

helpers = WorkflowTestMixin()


def run(coroutine_function, *args, **kwargs):
    """Await it from this sync test, as an async view would (asgiref's own bridge)."""
    return async_to_sync(coroutine_function)(*args, **kwargs)


@pytest.mark.django_db(transaction=True)
def test_astart_and_afind_write_and_read_the_rows_start_and_find_do():
    order = Order.objects.create()

    wf = run(Approval.astart, order, note="from an async view")

    record = WorkflowRun.objects.get(workflow_id=wf.workflow_id)
    assert (record.subject_id, record.arguments) == (str(order.pk), {"note": "from an async view"})
    found = run(Approval.afind, wf.workflow_id)
    assert isinstance(found, Approval) and found.workflow_id == wf.workflow_id
    assert run(Approval.afind, "not-a-uuid") is None


@pytest.mark.django_db(transaction=True)
def test_the_async_twins_raise_the_errors_of_the_sync_ones():
    order = Order.objects.create()
    run(Approval.astart, order)

    with pytest.raises(AlreadyRunning):
        run(Approval.astart, order)
    with pytest.raises(UnknownSignal):
        run(Approval.asignal_for, order, "aproved")
    with pytest.raises(NotOngoing):
        run(Approval.asignal_for, Order.objects.create(), "approved")
    assert run(Approval.asignal_for, Order.objects.create(), "approved", missing="ignore") is None


@pytest.mark.django_db(transaction=True)
def test_asignal_and_asignal_for_deliver_the_signal_rows():
    order = Order.objects.create()
    wf = Approval.start(order)

    first = run(wf.asignal, "approved", {"by": "alice"}, idempotency_key="once")
    again = run(Approval.asignal_for, order, "approved", {"by": "alice"}, idempotency_key="once")

    assert again.pk == first.pk and again.duplicate_delivery
    assert list(WorkflowSignal.objects.filter(run=wf.record).values_list("name", "payload")) == [
        ("approved", {"by": "alice"})
    ]


@pytest.mark.django_db(transaction=True)
def test_aresult_waits_for_the_end_on_a_thread_of_its_own_and_times_out_as_result_does():
    wf = NoOp1.start()
    with pytest.raises(TimeoutError):
        run(wf.aresult, timeout=0.2)

    ended = threading.Event()

    def finish_later():
        helpers.speedrun_workflow(NoOp1.find(wf.workflow_id))
        ended.set()

    finisher = threading.Thread(target=finish_later)
    finisher.start()
    result = run(wf.aresult, timeout=30)
    finisher.join(30)

    assert ended.is_set() and wf.record.status == "finished"
    assert result == NoOp1.find(wf.workflow_id).result(timeout=0)


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF="tests.async_urls")
def test_an_async_view_starts_and_signals_a_run_without_wrapping_a_call():
    order = Order.objects.create()
    client = AsyncClient()

    first = run(client.post, f"/orders/{order.pk}/approve/", json.dumps({"by": "bob"}), "application/json")
    second = run(client.post, f"/orders/{order.pk}/approve/", json.dumps({"by": "eve"}), "application/json")

    assert first.status_code == second.status_code == 200
    one, two = first.json(), second.json()
    assert one["workflow_id"] == two["workflow_id"] and (one["duplicate"], two["duplicate"]) == (False, True)
    payloads = WorkflowSignal.objects.filter(run__workflow_id=one["workflow_id"]).order_by("pk")
    assert list(payloads.values_list("payload", flat=True)) == [{"by": "bob"}, {"by": "eve"}]


@pytest.mark.django_db(transaction=True)
def test_a_waiting_aresult_holds_up_no_other_call():
    import asyncio

    wf = NoOp1.start()

    async def wait_and_start():
        waiting = asyncio.ensure_future(wf.aresult(timeout=30))
        await asyncio.sleep(0)  # the wait has begun
        other = await NoOp1.astart()  # runs on the shared thread while the wait goes on
        still_waiting = not waiting.done()
        await sync_to_async(lambda: helpers.speedrun_workflow(NoOp1.find(wf.workflow_id)))()
        await waiting
        return other, still_waiting

    other, still_waiting = run(wait_and_start)

    assert still_waiting and other.workflow_id != wf.workflow_id
