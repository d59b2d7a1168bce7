"""Workflow classes of the fairness tests (imported by ``workflows``, so dispatchers know them).

``Tenanted`` declares no fairness unless ``PGBUS_TESTAPP_FAIRNESS=1`` is in the process's
environment (a dispatcher of the fairness processes test, ``bench.fairness``): a project
whose classes all lack fairness sends the claim it always sent, and the rest of the suite
claims through it. In-process tests set ``fairness`` on the class themselves.
"""

import os
import time

from pgbus_workflows import Fairness, Workflow, step

from .models import SideEffect


def tenant_of(wf) -> str:
    """The run's tenant: its fairness key."""
    return f"tenant:{wf.arguments['tenant']}"


def tenant_weight(key: str) -> int:
    """A tenant whose name ends with ``-x3`` weighs 3."""
    return 3 if key.endswith("-x3") else 1


#: What the fairness tests and the benchmark set on ``Tenanted.fairness``.
TENANT_FAIRNESS = Fairness(key=tenant_of, weight=tenant_weight)


class Tenanted(Workflow):
    """Two short steps of one tenant's run, each recording its tenant when it ran (on its own queue)."""

    name = "tenanted"
    allow_multiple = True
    step_options = {"queue": "tenants"}
    fairness = TENANT_FAIRNESS if os.environ.get("PGBUS_TESTAPP_FAIRNESS") == "1" else None

    @step
    def first(self):
        time.sleep(self.arguments.get("seconds", 0))
        SideEffect.objects.create(label="tenant-first", key=self.arguments["tenant"])

    @step
    def second(self):
        SideEffect.objects.create(label="tenant-second", key=self.arguments["tenant"])
