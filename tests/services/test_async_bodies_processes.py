"""``async def`` bodies run by a real ``run_workflow_dispatcher``."""

import pytest

from pgbus_workflows.models import WorkflowRun
from tests.procs import eventually
from tests.testapp.async_workflows import AsyncPing
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_a_dispatcher_runs_async_bodies_to_the_end(dispatchers):
    runs = AsyncPing.start_many([{"arguments": {"n": n}} for n in range(12)])
    process = dispatchers("--concurrency", "2", settings={"POLL_INTERVAL": 0.2})

    finished = WorkflowRun.objects.filter(workflow_class=AsyncPing.name, status="finished")
    eventually(lambda: finished.count() == 12, timeout=60, what="the 12 async runs to finish")

    assert sorted(wf.reload().outputs["record"]["pong"] for wf in runs) == list(range(12)), process.output()
    assert SideEffect.objects.filter(label="async-ping").count() == 12
