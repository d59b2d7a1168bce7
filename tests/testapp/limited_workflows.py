"""Workflow classes of the flow-control tests (imported by ``workflows``, so dispatchers know them).

With ``PGBUS_TESTAPP_WITHOUT_LIMITS=1`` in its environment, a process of the test project
declares no limit at all (``workflows`` leaves this module out, the chaos class its lanes):
the baseline of ``bench.limits``, a project that declares none.
"""

import time
from datetime import timedelta

from pgbus_workflows import Concurrency, RateLimit, Workflow, step

from .models import SideEffect


class KeyedSleeper(Workflow):
    """One step at a time per account: each records when its body starts and ends, in id order."""

    name = "keyed_sleeper"
    allow_multiple = True
    step_options = {"queue": "keyed"}
    concurrency = Concurrency(key=lambda wf: f"account:{wf.arguments['account']}", limit=1)

    @step
    def work(self):
        key = f"{self.arguments['account']}|{self.workflow_id}"
        SideEffect.objects.create(label="keyed-start", key=key)
        time.sleep(self.arguments.get("seconds", 0.05))
        SideEffect.objects.create(label="keyed-end", key=key)

    @step
    def again(self):
        key = f"{self.arguments['account']}|{self.workflow_id}"
        SideEffect.objects.create(label="keyed-start", key=key)
        time.sleep(self.arguments.get("seconds", 0.05))
        SideEffect.objects.create(label="keyed-end", key=key)


class RateLimited(Workflow):
    """A shared token bucket: five starts per second, recorded with the time each began."""

    name = "rate_limited"
    allow_multiple = True
    step_options = {"queue": "rated"}

    @step(rate_limit=RateLimit("proc-rate", limit=5, per=timedelta(seconds=1)))
    def call(self):
        SideEffect.objects.create(label="rated", key=repr(time.time()))


class KeyedNoOp(Workflow):
    """Three empty steps under a key of the run's own (``bench.limits``: a backlog of distinct keys, limit 1)."""

    name = "keyed_noop"
    allow_multiple = True
    concurrency = Concurrency(key=lambda wf: f"noop:{wf.arguments['key']}", limit=1)

    @step
    def a(self):
        return None

    @step
    def b(self):
        return None

    @step
    def c(self):
        return None


class RateNoOp(Workflow):
    """One empty step under a shared bucket (``bench.limits``: the observed rate against the budget)."""

    name = "rate_noop"
    allow_multiple = True

    @step(rate_limit=RateLimit("bench-rate", limit=50, per=timedelta(seconds=1)))
    def call(self):
        return None


class KeyedGate(Workflow):
    """One step at a time per account; the body runs until the test opens its gate (a row), or two minutes pass."""

    name = "keyed_gate"
    allow_multiple = True
    step_options = {"queue": "gated"}
    concurrency = Concurrency(key=lambda wf: f"gate:{wf.arguments['account']}", limit=1)

    @step
    def work(self):
        key = str(self.workflow_id)
        SideEffect.objects.create(label="gate-start", key=key)
        deadline = time.monotonic() + 120
        while not SideEffect.objects.filter(label="gate-open", key=key).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        SideEffect.objects.create(label="gate-end", key=key)


class Unlimited(Workflow):
    """A step under no limit in the gated queue: it records that the dispatcher claimed past the held-back steps."""

    name = "gate_unlimited"
    allow_multiple = True
    step_options = {"queue": "gated"}

    @step
    def work(self):
        SideEffect.objects.create(label="unlimited", key=str(self.workflow_id))
