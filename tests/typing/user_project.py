# pyright: strict
"""A user's module as type checkers see it: CI runs mypy and pyright (strict) on this file.

Nothing imports or runs it; ``assert_type`` fails the type check when the public API stops
telling an editor what a call returns (``OrderWorkflow.start()`` is an ``OrderWorkflow``).
"""

from __future__ import annotations

from typing import Any, assert_type

from django.db import models

from pgbus_workflows import Concurrency, OnException, Workflow, backoff, step
from pgbus_workflows.models import WorkflowSignal
from pgbus_workflows.workflow.starter import Starter


class OrderWorkflow(Workflow):
    """The shape of a user's workflow class."""

    name = "typing_order"
    concurrency = Concurrency(key="orders", limit=2)
    exception_policies = [OnException(ConnectionError, action="reattempt", wait=backoff(base=1))]

    @step
    def reserve(self) -> dict[str, int]:
        return {"reserved": self.arguments["items"]}

    @step(atomic=True)
    def confirm(self) -> None:
        assert_type(self.outputs, dict[str, Any])


def a_view(order: models.Model) -> None:
    """What a view and an operator's script call, with the types an editor shows for them."""
    wf = OrderWorkflow.start(order, idempotency_key="order-1", items=3)
    assert_type(wf, OrderWorkflow)
    assert_type(wf.duplicate_start, bool)
    assert_type(wf.status, str)
    assert_type(OrderWorkflow.find(wf.workflow_id), OrderWorkflow | None)
    assert_type(Workflow.find(wf.workflow_id), Workflow | None)
    assert_type(OrderWorkflow.start_many([order]), list[OrderWorkflow])
    starter = OrderWorkflow.started_by("support:ann", reason="ticket 4411")
    assert_type(starter, Starter[OrderWorkflow])
    assert_type(starter.start(order), OrderWorkflow)
    assert_type(wf.pause(actor="alice", reason="fraud check"), OrderWorkflow)
    assert_type(wf.resume(actor="alice"), OrderWorkflow)
    assert_type(wf.cancel(actor="bob"), OrderWorkflow)
    assert_type(wf.rerun(actor="bob"), OrderWorkflow)
    assert_type(wf.signal("payment", {"amount": 42}), WorkflowSignal)


async def an_async_view(order: models.Model) -> None:
    """The async twins, awaited."""
    wf = await OrderWorkflow.astart(order, items=1)
    assert_type(wf, OrderWorkflow)
    assert_type(await OrderWorkflow.afind(wf.workflow_id), OrderWorkflow | None)
    assert_type(await wf.asignal("payment"), WorkflowSignal)
