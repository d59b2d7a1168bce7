"""The chaos harness's workflow (bench/chaos.py): its steps, each a different kind of promise.

With ``faults`` in its arguments (``bench/chaos.py --faults``), three more steps break the
engine from the inside on their first attempt: a body that raises ``SystemExit``, an output
with a NUL character, an atomic body that hangs past its ``timeout=``. Each is reattempted
(by the class policy, or as a stalled attempt) and passes the second time.

``chaos_durable`` is the harness's durable function (``bench/chaos.py --durable``): a loop of
checkpoints, a branch, a sleep and a wait for the signal the harness sends.

Imported by the app's ready() so that dispatcher subprocesses know it.
"""

import asyncio
import hashlib
import os
import threading
import time
from datetime import timedelta

from pgbus_workflows import Child, Concurrency, Job, OnException, Workflow, durable, fan_out, step
from pgbus_workflows.exceptions import PayloadNotSerializable

from .models import ChaosRecord


class FlakyService(ConnectionError):
    """A remote call that fails now and then."""


def _record(kind: str, run_key: str, key: str) -> None:
    ChaosRecord.objects.create(kind=kind, run_key=run_key, key=key, pid=os.getpid())


def chaos_job(run_key: str, index: int) -> int:
    """One fan-out member: records that it ran (at least once is the promise)."""
    _record("job", run_key, f"{run_key}:{index}")
    return index


class ChaosChild(Workflow):
    """A child of the chaos workflow: records that it ran and answers its index."""

    name = "chaos_child"
    allow_multiple = True

    @step
    def answer(self):
        _record("child", self.arguments["run_key"], f"{self.arguments['run_key']}:{self.arguments['index']}")
        return self.arguments["index"]


class ChaosWorkflow(Workflow):
    """Atomic insert, idempotency key, flaky call, signal wait, an async body, fan-out, children."""

    name = "chaos"
    #: Runs share ten lanes, three steps of a lane at a time: slots taken and given back
    #: through kills, stalls and faults (the harness checks every slot against the steps).
    concurrency = (
        Concurrency(key=lambda wf: f"chaos-lane:{wf.arguments.get('lane', 0)}", limit=3)
        if os.environ.get("PGBUS_TESTAPP_WITHOUT_LIMITS") != "1"
        else None
    )
    exception_policies = [
        OnException(FlakyService, action="reattempt", wait=timedelta(0), max_reattempts=10),
        OnException(SystemExit, PayloadNotSerializable, action="reattempt", wait=timedelta(0), max_reattempts=3),
    ]

    def _fault(self, name: str) -> bool:
        """Whether this run breaks ``name`` on this attempt (the first only)."""
        return name in self.arguments.get("faults", ()) and self.attempt == 1

    def _execution(self) -> None:
        # One row per attempt (step name and attempt number) and process: two processes on one attempt would show.
        _record("execution", str(self.workflow_id), f"{self.current_step}:{self.attempt}")

    @step(atomic=True)
    def write_receipt(self):
        self._execution()
        _record("atomic", str(self.workflow_id), "receipt")

    @step
    def record_key(self):
        self._execution()
        _record("key", str(self.workflow_id), self.step_idempotency_key)

    @step
    def call_flaky_service(self):
        self._execution()
        digest = hashlib.sha256(f"{self.workflow_id}:{self.attempt}".encode()).digest()
        if self.attempt < 4 and digest[0] % 3 == 0:
            raise FlakyService(f"flaky on attempt {self.attempt}")

    @step(wait_for="go")
    def wait_for_go(self):
        self._execution()
        return {"signal": self.received_signal.payload if self.received_signal else None}

    @step
    async def await_io(self):
        """An ``async def`` body: awaits, then records its execution through the async ORM."""
        await asyncio.sleep(0.01)
        key = f"{self.current_step}:{self.attempt}"
        await ChaosRecord.objects.acreate(kind="execution", run_key=str(self.workflow_id), key=key, pid=os.getpid())

    @fan_out(max_attempts=3)
    def fan(self):
        self._execution()
        return [Job(chaos_job, str(self.workflow_id), i) for i in range(3)]

    @fan_out
    def ship_children(self):
        self._execution()
        return [Child(ChaosChild, run_key=str(self.workflow_id), index=i) for i in range(2)]

    @step
    def exit_once(self):
        self._execution()
        if self._fault("exit"):
            raise SystemExit("a body that calls sys.exit()")

    @step
    def nul_output_once(self):
        self._execution()
        return {"text": "nul\x00" if self._fault("nul") else "clean"}

    @step(atomic=True, timeout=timedelta(seconds=1))
    def hang_once(self):
        _record("hung", str(self.workflow_id), f"attempt {self.attempt}")  # rolled back with a hung attempt
        if self._fault("hang"):
            threading.Event().wait(2.5)  # past the timeout: the database ends the session


def _durable_body(ctx, value, pause: float = 0.02):
    """A checkpoint body of :func:`chaos_durable`: one row per execution (key: its checkpoint), then ``value``.

    It lingers a moment so that some kills land while a body is in flight.
    """

    def body():
        _record("durable", ctx.workflow_id, ctx.step_idempotency_key)
        time.sleep(pause)
        return value

    return body


#: The signal the harness sends to the durable runs (the one the step class waits for too).
DURABLE_SIGNAL = "go"


@durable(name="chaos_durable", allow_multiple=True)
def chaos_durable(ctx, pages):
    """The chaos harness's durable function: a loop of checkpoints, a branch, a sleep, a signal wait.

    Its result follows from ``pages`` and the signal's payload (``expected_durable_result``).
    """
    total = 0
    for n in range(pages):
        total += ctx.step("page", _durable_body(ctx, n))
    side = "even" if total % 2 == 0 else "odd"
    ctx.step(side, _durable_body(ctx, side))  # a branch on recorded data
    ctx.sleep("breathe", timedelta(milliseconds=300))
    go = ctx.wait_for(DURABLE_SIGNAL, timeout=timedelta(minutes=10))
    done = ctx.step("finish", _durable_body(ctx, "done"))
    return {"total": total, "side": side, "go": go, "done": done}


def expected_durable_checkpoints(pages: int) -> list[str]:
    """The checkpoints a run of :func:`chaos_durable` records, in order."""
    side = "even" if sum(range(pages)) % 2 == 0 else "odd"
    loop = ["page" if n == 0 else f"page#{n + 1}" for n in range(pages)]
    return [*loop, side, "breathe", DURABLE_SIGNAL, "finish"]


def expected_durable_result(pages: int, payload) -> dict:
    """The result a run of :func:`chaos_durable` must finish with, given the signal's ``payload``."""
    total = sum(range(pages))
    return {"total": total, "side": "even" if total % 2 == 0 else "odd", "go": payload, "done": "done"}
