"""Workflows that break the engine from the inside (tests/services/test_faults*.py): one class per fault.

Imported by the app's ready() so that dispatcher subprocesses know them. Every body records
its runs in ``SideEffect`` (outside atomic bodies), so a body that ran twice would show.
"""

import asyncio
import threading
import time
from datetime import timedelta

from django.db import DatabaseError, connection

from pgbus_workflows import Job, Workflow, fan_out, step

from .models import Receipt, SideEffect

#: What ``RaisesBaseException`` raises, by the name in its arguments.
BASE_EXCEPTIONS = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
    "CancelledError": asyncio.CancelledError,
}


def ran(label: str, attempt: int) -> None:
    SideEffect.objects.create(label=label, key=str(attempt))


class RaisesBaseException(Workflow):
    """A body that raises SystemExit, KeyboardInterrupt, GeneratorExit or CancelledError."""

    name = "faults_base_exception"
    allow_multiple = True

    @step
    def leave(self):
        ran("base-exception", self.attempt)
        raise BASE_EXCEPTIONS[self.arguments["kind"]]()

    @step
    def after(self):
        ran("base-exception-after", self.attempt)


class NulOutput(Workflow):
    """A body whose output holds a NUL character, which PostgreSQL's jsonb refuses."""

    name = "faults_nul_output"
    allow_multiple = True

    @step
    def emit(self):
        ran("nul-output", self.attempt)
        return {"text": "before\x00after"}


class NulError(Workflow):
    """A body whose error message holds a NUL character (a text column refuses it)."""

    name = "faults_nul_error"
    allow_multiple = True

    @step
    def fail(self):
        ran("nul-error", self.attempt)
        raise ValueError("bad\x00byte")


def broken_wait(attempt: int) -> timedelta:
    raise ZeroDivisionError(f"the wait of attempt {attempt} cannot be computed")


class BrokenWait(Workflow):
    """The second step's ``wait=`` callable raises: the first step's outcome cannot be written."""

    name = "faults_broken_wait"
    allow_multiple = True

    @step
    def first(self):
        ran("broken-wait-first", self.attempt)

    @step(wait=broken_wait)
    def second(self):
        ran("broken-wait-second", self.attempt)


class HugeReattemptWait(Workflow):
    """``reattempt(wait=)`` so long that the next attempt's time is past the calendar."""

    name = "faults_huge_wait"
    allow_multiple = True

    @step
    def again(self):
        ran("huge-wait", self.attempt)
        self.reattempt(wait=timedelta(days=999_999_999))


class SwallowsDatabaseError(Workflow):
    """An atomic body that catches a database error and carries on (its transaction is aborted)."""

    name = "faults_swallows_db_error"
    allow_multiple = True

    @step(atomic=True)
    def swallow(self):
        Receipt.objects.create(note="swallowed")
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 / 0")
        except DatabaseError:
            pass
        return "carried on"


class HungAtomic(Workflow):
    """An atomic body that sits in Python holding its run's lock (first attempt only)."""

    name = "faults_hung_atomic"
    allow_multiple = True

    @step(atomic=True, timeout=timedelta(seconds=1))
    def hang(self):
        Receipt.objects.create(note=f"hung {self.attempt}")
        if self.attempt == 1:
            time.sleep(self.arguments.get("seconds", 3))

    @step
    def after(self):
        ran("hung-after", self.attempt)


class SlowAtomicQuery(Workflow):
    """An atomic body whose query runs past its ``timeout=`` (first attempt only)."""

    name = "faults_slow_atomic_query"
    allow_multiple = True

    @step(atomic=True, timeout=timedelta(seconds=1))
    def query(self):
        Receipt.objects.create(note=f"query {self.attempt}")
        if self.attempt == 1:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_sleep(5)")


class HoldsLock(Workflow):
    """An atomic body that holds its run's lock for a while, within its timeout (the sweep must not wait)."""

    name = "faults_holds_lock"
    allow_multiple = True

    @step(atomic=True, timeout=timedelta(seconds=60))
    def hold(self):
        Receipt.objects.create(note="held")
        time.sleep(self.arguments.get("seconds", 4))


class CommitFails(Workflow):
    """An atomic step whose COMMIT fails (tests add a deferred trigger that refuses it)."""

    name = "faults_commit_fails"
    allow_multiple = True

    @step(atomic=True)
    def commit_fails(self):
        Receipt.objects.create(note="commit fails")

    @step
    def next_one(self):
        ran("commit-fails-next", self.attempt)


def nul_result(index: int) -> str:
    """A fan-out member; number 3 returns a NUL character."""
    SideEffect.objects.create(label="nul-job", key=str(index))
    return "x\x00y" if index == 3 else str(index)


def failing_job(index: int) -> int:
    SideEffect.objects.create(label="backoff-job", key=str(index))
    raise ValueError(f"job {index} fails")


def broken_backoff(attempt: int) -> timedelta:
    raise ZeroDivisionError("the backoff cannot be computed")


class NulJobResult(Workflow):
    """Six jobs; one returns a NUL character: the other five results must be kept."""

    name = "faults_nul_job"
    allow_multiple = True

    @fan_out(on_job_failure="continue")
    def jobs(self):
        return [Job(nul_result, i) for i in range(6)]


class BrokenBackoff(Workflow):
    """A job that fails, with retries left, and a ``backoff`` callable that raises."""

    name = "faults_broken_backoff"
    allow_multiple = True

    @fan_out(max_attempts=3, backoff=broken_backoff)
    def jobs(self):
        return [Job(failing_job, 0)]


def exiting_job(index: int) -> int:
    SideEffect.objects.create(label="exiting-job", key=str(index))
    raise SystemExit(index)


class JobRaisesSystemExit(Workflow):
    """A fan-out member that raises SystemExit."""

    name = "faults_job_exit"
    allow_multiple = True

    @fan_out(on_job_failure="continue")
    def jobs(self):
        return [Job(exiting_job, i) for i in range(2)]


class TimesOut(Workflow):
    """A wait with a short timeout that skips on to an ordinary step."""

    name = "faults_times_out"
    allow_multiple = True

    @step(wait_for="never", wait_timeout=timedelta(seconds=1), on_timeout="skip")
    def wait(self):
        ran("waited", self.attempt)

    @step
    def after(self):
        ran("times-out-after", self.attempt)


class TimesOutIntoBrokenWait(Workflow):
    """The same, but the step it skips on to has a ``wait=`` that raises: a row the sweep fails on."""

    name = "faults_times_out_broken"
    allow_multiple = True

    @step(wait_for="never", wait_timeout=timedelta(seconds=1), on_timeout="skip")
    def wait(self):
        ran("waited", self.attempt)

    @step(wait=broken_wait)
    def after(self):
        ran("broken-after", self.attempt)


class AtomicHeartbeat(Workflow):
    """An atomic body that heartbeats (it holds its run's lock: nothing to write)."""

    name = "faults_atomic_heartbeat"
    allow_multiple = True

    @step(atomic=True)
    def beat(self):
        return {"alive": self.heartbeat()}


class WaitsBetween(Workflow):
    """A three-second ``wait=`` between two steps: a host whose clock runs ahead must not cut it short."""

    name = "faults_waits_between"
    allow_multiple = True

    @step
    def first(self):
        ran("waits-between-first", self.attempt)

    @step(wait=timedelta(seconds=3))
    def second(self):
        ran("waits-between-second", self.attempt)


class SlowBody(Workflow):
    """A body of a few seconds, recording each run of it (a skewed sweeper must not stall it)."""

    name = "faults_slow_body"
    allow_multiple = True

    @step
    def slow(self):
        ran("slow-body", self.attempt)
        # Not time.sleep: under libfaketime with a true monotonic clock it fails (EINVAL).
        threading.Event().wait(self.arguments.get("seconds", 3))


class LosesConnection(Workflow):
    """A body whose database connection is killed under it (first attempt only), as in a restart."""

    name = "faults_loses_connection"
    allow_multiple = True

    @step
    def query(self):
        ran("loses-connection", self.attempt)
        if self.attempt == 1:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
