"""Workflow classes of the flow-control tests (imported by ``workflows``, so dispatchers know them)."""

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
