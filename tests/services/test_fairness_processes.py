"""Fairness held by real ``run_workflow_dispatcher`` processes: two dispatchers take the keys in turn."""

import pytest

from pgbus_workflows.models import Dispatcher, WorkflowRun, WorkflowStep
from tests.procs import eventually
from tests.testapp.fair_workflows import TENANT_FAIRNESS, Tenanted
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

FAST = {"SWEEP_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5, "POLL_INTERVAL": 0.2}
#: The dispatchers' code declares ``Tenanted.fairness`` (``tests.testapp.fair_workflows``).
FAIR_ENV = {"PGBUS_TESTAPP_FAIRNESS": "1"}


def test_a_tenant_with_few_runs_finishes_before_a_tenant_with_many_drains_across_two_dispatchers(
    dispatchers, change_classes
):
    change_classes(Tenanted, "fairness", TENANT_FAIRNESS)  # this process starts the runs: it tags them
    Tenanted.start_many([{"arguments": {"tenant": "big"}} for _ in range(150)])
    for _ in range(10):
        Tenanted.start(tenant="small")  # each started after every run of big

    dispatchers("--concurrency", "2", settings=FAST, env=FAIR_ENV)
    dispatchers("--concurrency", "2", settings=FAST, env=FAIR_ENV)
    eventually(
        lambda: WorkflowRun.objects.filter(workflow_class=Tenanted.name, status="finished").count() == 160,
        timeout=120,
        what="the 160 runs to finish",
    )

    # Ordering, not timing: the bodies' rows, in the order they were written.
    firsts = list(SideEffect.objects.filter(label="tenant-first").order_by("pk").values_list("key", flat=True))
    seconds = list(SideEffect.objects.filter(label="tenant-second").order_by("pk").values_list("key", flat=True))
    assert firsts.count("small") == seconds.count("small") == 10
    last_small = max(i for i, tenant in enumerate(seconds) if tenant == "small")
    # In turn, small's ten runs end among the first forty or so; in due order they would end last (150 + 10).
    assert last_small < 60, f"small's last run finished {last_small + 1}th of {len(seconds)}"
    assert Dispatcher.objects.count() == 2
    # Each step claimed once, by one dispatcher or the other: one attempt each, none stalled or repeated.
    steps = WorkflowStep.objects.filter(run__workflow_class=Tenanted.name)
    assert steps.count() == 320 and set(steps.values_list("attempt", "status").distinct()) == {(1, "completed")}
