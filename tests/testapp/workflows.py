"""Workflow classes the tests use, one per behaviour (autodiscovered like a user's).

Dispatcher subprocesses find these through autodiscovery, so the tests that start real
dispatchers use the classes defined here.
"""

import os
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from pgbus_workflows import Job, Schedule, Workflow, fan_out, step

from .jobs import square
from .models import SideEffect


def record(label: str, key: str = "") -> None:
    SideEffect.objects.create(label=label, key=key)


class ThreeSteps(Workflow):
    name = "three_steps"

    @step
    def one(self):
        record("one")
        return {"n": 1}

    @step
    def two(self):
        record("two", self.step_idempotency_key)
        return {"n": self.outputs["one"]["n"] + 1}

    @step
    def three(self):
        record("three")


def mark(workflow, label: str) -> None:
    """Record that this attempt reached ``label`` (key: run, step, attempt)."""
    record(label, f"{workflow.workflow_id}:{workflow.step_idempotency_key.split(':')[-1]}:{workflow.attempt}")


class Counted(Workflow):
    """Three steps, each recording one SideEffect per attempt: duplicates would show."""

    name = "counted"

    @step
    def first(self):
        mark(self, "first")

    @step
    def second(self):
        mark(self, "second")

    @step
    def third(self):
        mark(self, "third")


class Slow(Workflow):
    """A step that takes ``seconds`` (argument) and records when it starts and ends."""

    name = "slow"

    @step
    def work(self):
        mark(self, "slow-start")
        time.sleep(self.arguments.get("seconds", 2))
        mark(self, "slow-end")

    @step
    def after(self):
        mark(self, "after")


class HangsOnce(Workflow):
    """The first attempt hangs far past its timeout; the sweep stalls it and the next one ends at once."""

    name = "hangs_once"

    @step(timeout=timedelta(seconds=1))
    def hang(self):
        mark(self, "hang-start")
        if self.attempt == 1:
            time.sleep(self.arguments.get("seconds", 4))
        mark(self, "hang-end")


class Waits(Workflow):
    """The second step waits two seconds after the first."""

    name = "waits"

    @step
    def now(self):
        mark(self, "now")

    @step(wait=timedelta(seconds=2))
    def later(self):
        mark(self, "later")


class Approval(Workflow):
    """Its first step waits for the "approved" signal (the payload is its output), then it finishes."""

    name = "approval"

    @step(wait_for="approved")
    def approve(self):
        return self.received_signal.payload

    @step
    def done(self):
        mark(self, "approved")


class NoOp3(Workflow):
    """Three empty steps: what the benchmarks measure is the engine, not the bodies."""

    name = "noop3"

    @step
    def a(self):
        pass

    @step
    def b(self):
        pass

    @step
    def c(self):
        pass


class NoOp1(Workflow):
    """One empty step (the latency benchmark)."""

    name = "noop1"

    @step
    def only(self):
        pass


class Squares(Workflow):
    """Fans out one job per number, then sums the results."""

    name = "squares"

    @fan_out(max_attempts=2)
    def compute(self):
        return [Job(square, n) for n in range(self.arguments.get("count", 5))]

    @step
    def total(self):
        return {"sum": sum(self.fan_out_results("compute"))}


# -- fan-out classes the dispatcher subprocesses and the fan-out benchmark use -------------------


class FanSleepy(Workflow):
    """One job hangs on its first attempt (a SIGKILL victim), the others are quick; then a step reads them."""

    name = "fan_sleepy"

    @fan_out(max_attempts=2)
    def work(self):
        from .jobs import record_job, sleepy_once

        jobs = [Job(sleepy_once, "slow", self.arguments.get("seconds", 30))]
        return jobs + [Job(record_job, f"quick-{i}") for i in range(self.arguments.get("quick", 4))]

    @step
    def after(self):
        return {"results": list(self.fan_out_results("work"))}


class FanDrain(Workflow):
    """``count`` jobs, each recording one SideEffect (duplicates would show), then a step counts them."""

    name = "fan_drain"

    @fan_out
    def drain(self):
        from .jobs import record_job

        seconds = self.arguments.get("job_seconds", 0)
        return [Job(record_job, f"drain-{i}", seconds) for i in range(self.arguments.get("count", 300))]

    @step
    def after(self):
        return {"n": sum(1 for _ in self.fan_out_results("drain"))}


class FanBench(Workflow):
    """``count`` trivial jobs (the fan-out benchmark), then an empty step."""

    name = "fan_bench"

    @fan_out
    def jobs(self):
        from .jobs import noop

        return [Job(noop, i) for i in range(self.arguments.get("count", 10_000))]

    @step
    def done(self):
        pass


def _quick(self):
    pass


#: A run of a hundred quick steps: a worker chains them one after the other for a while.
LongChain = type(
    "LongChain",
    (Workflow,),
    {
        "__module__": __name__,
        "__doc__": "A hundred empty steps: a worker busy with one run's chain for a good while.",
        "name": "long_chain",
        **{f"s{number:03d}": step(_quick) for number in range(100)},
    },
)


class Probe(Workflow):
    """One step whose output is the time its body began (the call-to-body latency benchmark)."""

    name = "bench_probe"

    @step
    def only(self):
        return {"body_at": time.time()}


class FailsFirst(Workflow):
    """Its first step raises on its first attempt: the run pauses on that error (stuck: paused_on_error)."""

    name = "fails_first"

    @step
    def flaky(self):
        if self.attempt == 1:
            raise RuntimeError("the first attempt fails")

    @step
    def after(self):
        mark(self, "after-flaky")


class FanWritesThenFails(Workflow):
    """Job 0 writes a row, then fails; job 1 reports whether it runs in a transaction; the step goes on."""

    name = "fan_writes_then_fails"

    @fan_out(on_job_failure="continue")
    def work(self):
        from .jobs import fail_on, transaction_state

        return [Job(fail_on, 0, [0]), Job(transaction_state)]

    @step
    def after(self):
        return {"results": list(self.fan_out_results("work"))}


class FanJsonArguments(Workflow):
    """One job given a date, a Decimal, a datetime and a tuple; the next step keeps what it received."""

    name = "fan_json_arguments"

    @fan_out
    def work(self):
        from .jobs import types_of

        at = datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
        return [Job(types_of, date(2024, 1, 2), Decimal("1.50"), at, (1, 2))]

    @step
    def after(self):
        return {"received": list(self.fan_out_results("work"))}


class YearlyReport(Workflow):
    """Declared schedules, synced from code: ticks that a test's dispatcher never meets by chance."""

    name = "yearly_report"
    schedules = [
        Schedule(cron="0 3 1 1 *", timezone="Europe/Paris", arguments={"kind": "yearly"}),
        Schedule(every=timedelta(days=366), name="leap", overlap="allow", catchup="all", enabled=False),
    ]

    @step
    def report(self):
        record("report", self.scheduled_for.isoformat() if self.scheduled_for else "")


class Ticked(Workflow):
    """Scheduled at run time (``add_schedule``) by the schedule tests: its body records its tick."""

    name = "ticked"

    @step
    def note(self):
        record("ticked", self.scheduled_for.isoformat())


from .async_workflows import AsyncPing  # noqa: E402, F401
from .child_workflows import Abandoned, Forever, Many, Shipment, ShipOrder, ShipWhatever, SlowChild, Tree, Waiter  # noqa: E402, F401
from .durable_workflows import durable_journey, durable_killed  # noqa: E402, F401
from .fair_workflows import Tenanted  # noqa: E402, F401
from .held_workflows import FreeWork, HeldSignalled, HeldWork  # noqa: E402, F401
from .routed_workflows import durable_routed_processes  # noqa: E402, F401

if os.environ.get("PGBUS_TESTAPP_WITHOUT_LIMITS") != "1":  # bench.limits's baseline: a project without limits
    from .limited_workflows import KeyedNoOp, KeyedSleeper, RateLimited, RateNoOp  # noqa: F401
