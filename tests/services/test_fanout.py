"""Fan-out steps: opening (jobs, JSON, limits, one transaction), running jobs, resolving, the sweep,
the operator verbs, ``complete_fan_out``, ``progress`` and the races around the last job.

Jobs are run with the public job functions (``claim_due_jobs``, ``claim_job``, ``execute_job``);
everything is asserted on the rows. The subprocess tests are in ``test_fanout_processes.py``.
"""

import os
import subprocess
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.test import TestCase, override_settings
from django.utils import timezone

from pgbus_workflows import ConfigurationError, Job, OnException, Workflow, fan_out, step
from pgbus_workflows.conf import settings as wf_settings
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.exceptions import FanOutFailed, StepWaiting, TestHelperError
from pgbus_workflows.models import Dispatcher, FanOutJob, WorkflowStep
from pgbus_workflows.services.claims import claim_step
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.fanout import (
    cancel_pending_jobs,
    claim_due_jobs,
    claim_job,
    execute_job,
)
from pgbus_workflows.services.fanout_recovery import recover_jobs, resolve_lost_fan_outs
from pgbus_workflows.services.locks import resolve_if_done
from pgbus_workflows.services.resolution import progress
from pgbus_workflows.sql import clock
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import events_of, kinds, run_next
from tests.testapp import jobs as job_module
from tests.testapp.jobs import drop_connection_once, fail_on, flaky, meet, noop, oversized, record_job, square
from tests.testapp.models import SideEffect
from tests.threads import JOIN_TIMEOUT, Worker

pytestmark = pytest.mark.django_db


def local_function(n):
    """A module-level function of the tests package, which is not an installed app."""
    return n


# -- workflows -------------------------------------------------------------------------------------


class FanSum(Workflow):
    """``count`` squares, then a step summing ``fan_out_results``."""

    name = "fanout_sum"

    @fan_out(max_attempts=2)
    def compute(self):
        return [Job(square, n) for n in range(self.arguments.get("count", 4))]

    @step
    def total(self):
        results = self.fan_out_results("compute")
        assert isinstance(results, Iterator)
        values = list(results)
        return {"sum": sum(v for v in values if v is not None), "results": values}


class FanGenerator(Workflow):
    """The body returns a generator (any iterable of Job)."""

    name = "fanout_generator"

    @fan_out
    def compute(self):
        return (Job(square, n) for n in range(3))

    @step
    def total(self):
        return {"results": list(self.fan_out_results("compute"))}


class FanReturns(Workflow):
    """The body returns ``self.arguments["what"]`` made by BODIES (bad returns, bad arguments)."""

    name = "fanout_returns"

    @fan_out
    def compute(self):
        return BODIES[self.arguments["what"]]()

    @step
    def after(self):
        pass


class FanReturnsSkips(Workflow):
    """As FanReturns, with on_exception="skip"."""

    name = "fanout_returns_skips"

    @fan_out(on_exception="skip")
    def compute(self):
        return BODIES[self.arguments["what"]]()

    @step
    def after(self):
        pass


class FanReturnsCancels(Workflow):
    """As FanReturns, with on_exception="cancel"."""

    name = "fanout_returns_cancels"

    @fan_out(on_exception="cancel")
    def compute(self):
        return BODIES[self.arguments["what"]]()

    @step
    def after(self):
        pass


class _NotJSON:
    pass


def _nested_job():
    def inner(n):
        return n

    return [Job(inner, 1)]


BODIES = {
    "none": lambda: None,
    "int": lambda: 5,
    "str": lambda: "abc",
    "dict": lambda: {"a": Job(square, 1)},
    "job": lambda: Job(square, 1),
    "mixed": lambda: [Job(square, 1), 5],
    "oversize": lambda: [Job(square, 1), Job(square, "x" * 5000)],
    "oversize_kwarg": lambda: [Job(fail_on, 1, bad=list(range(2000)))],
    "not_json": lambda: [Job(square, 1), Job(square, _NotJSON())],
    "set": lambda: [Job(square, {1, 2})],
    "not_installed": lambda: [Job(local_function, 1)],
    "lambda": lambda: [Job(lambda n: n, 1)],
    "nested": _nested_job,
    "builtin": lambda: [Job(len, [1])],
    "empty": lambda: [],
    "empty_generator": lambda: (Job(square, n) for n in ()),
    "tampered": lambda: [Job(square, 1)],
}


class FanFails(Workflow):
    """Three jobs, the one for 1 fails (default policy: pause)."""

    name = "fanout_fails"

    @fan_out
    def compute(self):
        return [Job(fail_on, n, bad=self.arguments.get("bad", [1])) for n in range(3)]

    @step
    def after(self):
        return {"results": list(self.fan_out_results("compute"))}


class FanFailsSkip(Workflow):
    name = "fanout_fails_skip"

    @fan_out(on_exception="skip")
    def compute(self):
        return [Job(fail_on, n, bad=[1]) for n in range(3)]

    @step
    def after(self):
        return {"results": list(self.fan_out_results("compute"))}


class FanFailsCancel(Workflow):
    name = "fanout_fails_cancel"

    @fan_out(on_exception="cancel")
    def compute(self):
        return [Job(fail_on, n, bad=[1]) for n in range(3)]

    @step
    def after(self):
        pass


class FanFailsContinue(Workflow):
    name = "fanout_fails_continue"

    @fan_out(on_job_failure="continue")
    def compute(self):
        return [Job(fail_on, n, bad=[1]) for n in range(3)]

    @step
    def after(self):
        return {"results": list(self.fan_out_results("compute"))}


class FanFailsClassPolicy(Workflow):
    """A class-level policy for FanOutFailed applies to the fan-out step."""

    name = "fanout_fails_class_policy"
    exception_policies = [OnException(FanOutFailed, action="skip")]

    @fan_out
    def compute(self):
        return [Job(fail_on, n, bad=[1]) for n in range(3)]

    @step
    def after(self):
        pass


class FanFailsReattempt(Workflow):
    """FanOutFailed reattempts the whole fan-out once, then pauses."""

    name = "fanout_fails_reattempt"

    @fan_out(on_exception="reattempt", max_reattempts=1)
    def compute(self):
        return [Job(flaky, f"{self.workflow_id}:{n}", 2 if n == 1 else 0) for n in range(2)]

    @step
    def after(self):
        return {"results": list(self.fan_out_results("compute"))}


class FanBackoff(Workflow):
    """Jobs with three attempts, 30 s apart."""

    name = "fanout_backoff"

    @fan_out(max_attempts=3, backoff=timedelta(seconds=30))
    def work(self):
        return [Job(flaky, "a", 1), Job(flaky, "b", 5)]

    @step
    def after(self):
        pass


#: The attempts the callable backoff was asked about.
BACKOFF_CALLS = []


def growing_backoff(attempt):
    BACKOFF_CALLS.append(attempt)
    return timedelta(seconds=10 * attempt)


class FanCallableBackoff(Workflow):
    name = "fanout_callable_backoff"

    @fan_out(max_attempts=3, backoff=growing_backoff)
    def work(self):
        return [Job(flaky, "c", 5)]


class FanOptions(Workflow):
    """Queue, priority and timeout go onto the jobs."""

    name = "fanout_options"

    @fan_out(queue="fanq", priority=3, timeout=timedelta(seconds=5))
    def work(self):
        return [Job(noop, n) for n in range(2)]


class FanClassQueue(Workflow):
    name = "fanout_class_queue"
    step_options = {"queue": "fan-class-q", "priority": -2}

    @fan_out
    def work(self):
        return [Job(noop, 1)]


class FanSkipIf(Workflow):
    name = "fanout_skip_if"

    @fan_out(skip_if=lambda wf: wf.arguments.get("skip", False))
    def work(self):
        return [Job(noop, 1)]

    @step
    def after(self):
        pass


class FanWaits(Workflow):
    name = "fanout_waits"

    @fan_out(wait=timedelta(hours=1))
    def work(self):
        return [Job(noop, 1)]


class FanMany(Workflow):
    """``count`` trivial jobs (the bulk-insert test)."""

    name = "fanout_many"

    @fan_out
    def work(self):
        return [Job(noop, i) for i in range(self.arguments.get("count", 10_000))]


class FanOversizedResult(Workflow):
    name = "fanout_oversized_result"

    @fan_out(on_job_failure="continue")
    def work(self):
        return [Job(oversized, 5000), Job(oversized, 10)]


class FanRetries(Workflow):
    """Two attempts per job: the sweep puts a stalled job back once, then fails it."""

    name = "fanout_retries"

    @fan_out(max_attempts=2)
    def work(self):
        return [Job(record_job, f"r{n}") for n in range(self.arguments.get("count", 2))]

    @step
    def after(self):
        pass


class FanFlakyRetries(Workflow):
    """A job that fails on its first call and has a second attempt."""

    name = "fanout_flaky_retries"

    @fan_out(max_attempts=2)
    def work(self):
        return [Job(flaky, f"{self.workflow_id}:{n}", 1) for n in range(self.arguments.get("count", 2))]

    @step
    def after(self):
        pass


class FanMeetLocal(Workflow):
    """Two jobs that meet at a barrier, then a step (the last-two-jobs race)."""

    name = "fanout_meet"

    @fan_out
    def pair(self):
        return [Job(meet, self.arguments["barrier"], i) for i in range(2)]

    @step
    def after(self):
        return {"results": list(self.fan_out_results("pair"))}


class FanPlainStep(Workflow):
    """A plain step before the fan-out: fan_out_results of it is empty."""

    name = "fanout_plain_step"

    @step
    def plain(self):
        return {"results": list(self.fan_out_results("plain"))}

    @step
    def missing(self):
        return list(self.fan_out_results("no_such_step"))


class FanDropsConnection(Workflow):
    """One job during which the server drops the connection (a database blip)."""

    name = "fanout_drops_connection"

    @fan_out
    def work(self):
        return [Job(drop_connection_once, "blip")]

    @step
    def after(self):
        pass


# -- helpers ---------------------------------------------------------------------------------------


def run_jobs(claimed_by="test"):
    """Claim and run due jobs until none is due; returns how many ran."""
    ran = 0
    while True:
        claimed = claim_due_jobs(100, claimed_by=claimed_by)
        for job in claimed:
            execute_job(job)
        ran += len(claimed)
        if not claimed:
            return ran


def jobs_of(step):
    return list(FanOutJob.objects.filter(step_id=step.pk).order_by("index"))


def make_due(step):
    """Cut the backoff of the step's pending jobs short: due now by the engine's clock, the one the claim reads.

    This host's clock would do only as well as the engine's reading of the server's (half a
    round trip subtracted): on a loaded machine that reading came out a few ms behind, and
    jobs made due a moment before a claim were not due yet for it (seen once in CI).
    """
    FanOutJob.objects.filter(step_id=step.pk, status="pending").update(scheduled_at=clock.now())


# -- 1. opening a fan-out ----------------------------------------------------------------------------


def test_the_body_jobs_are_stored_and_park_the_step_and_the_run():
    wf = FanSum.start(count=4)

    step = run_next(wf)

    assert (step.status, step.fan_out_total) == ("waiting", 4)
    assert step.waiting_since is not None and step.stall_at is None
    assert (wf.status, wf.current_step) == ("waiting", "compute")
    rows = jobs_of(step)
    assert [j.index for j in rows] == [0, 1, 2, 3]
    assert {j.function for j in rows} == {"tests.testapp.jobs.square"}
    assert [j.arguments for j in rows] == [{"args": [n], "kwargs": {}} for n in range(4)]
    assert {(j.status, j.attempts, j.max_attempts, j.queue, j.priority) for j in rows} == {
        ("pending", 0, 2, step.queue, step.priority)
    }
    assert {j.run_id for j in rows} == {wf.record.pk}
    started = events_of(wf, "fan_out_started")
    assert len(started) == 1
    assert started[0].details == {"jobs": 4}
    assert (started[0].transition, started[0].from_status, started[0].to_status) == ("park", "performing", "waiting")
    assert started[0].step_id == step.pk
    assert not SideEffect.objects.exists(), "no job runs before a dispatcher claims it"


def test_a_generator_of_jobs_is_an_iterable_of_job():
    wf = FanGenerator.start()

    step = run_next(wf)
    run_jobs()
    run_next(wf)

    assert step.fan_out_total == 3
    assert WorkflowStep.objects.get(run=wf.record, step_name="total").output == {"results": [0, 1, 4]}


def test_job_args_and_kwargs_are_stored_as_json_and_passed_back():
    wf = FanFails.start(bad=[7])

    step = run_next(wf)
    assert jobs_of(step)[2].arguments == {"args": [2], "kwargs": {"bad": [7]}}
    run_jobs()

    assert [j.result for j in jobs_of(step)] == [0, 1, 2]


def test_the_jobs_are_written_in_the_transaction_that_parks_the_step(monkeypatch):
    """When the unit of work fails at its very end (the run, events and NOTIFY), no job, no park, no event remain."""
    wf = FanSum.start(count=3)
    scheduled = WorkflowStep.objects.get(run=wf.record)
    claimed = claim_step(scheduled.pk, "test")

    def broken_flush(batch, channel):
        raise RuntimeError("the database went away at commit")

    monkeypatch.setattr("pgbus_workflows.sql.bulk.WriteBatch.send", broken_flush)
    with pytest.raises(RuntimeError, match="went away"):
        execute_step(claimed)

    assert not FanOutJob.objects.exists()
    assert WorkflowStep.objects.get(pk=claimed.pk).status == "in_progress"
    assert wf.reload().status == "performing"
    assert "fan_out_started" not in kinds(wf)


def test_a_job_is_stored_by_dotted_path_and_only_module_level_functions_of_installed_apps_are_jobs():
    assert Job(square, 2).path == "tests.testapp.jobs.square"
    with pytest.raises(ConfigurationError, match="not in an installed app"):
        Job(local_function, 1)
    with pytest.raises(ConfigurationError, match="module-level"):
        Job(lambda n: n, 1)
    with pytest.raises(ConfigurationError, match="plain function"):
        Job(len, [1])
    with pytest.raises(ConfigurationError, match="plain function"):
        Job(os.system, "true")


@pytest.mark.parametrize(
    ("what", "error_class", "message"),
    [
        ("none", "TypeError", "must return an iterable of Job or of Child, got NoneType"),
        ("int", "TypeError", "must return an iterable of Job or of Child, got int"),
        ("str", "TypeError", "must return an iterable of Job or of Child, got str"),
        ("dict", "TypeError", "must return an iterable of Job or of Child, got dict"),
        ("job", "TypeError", "must return an iterable of Job or of Child, got Job"),
        ("mixed", "TypeError", "returned 5 at index 1, not a Job"),
        ("oversize", "pgbus_workflows.exceptions.PayloadTooLarge", "over MAX_PAYLOAD_SIZE (4096 bytes)"),
        ("oversize_kwarg", "pgbus_workflows.exceptions.PayloadTooLarge", "arguments of tests.testapp.jobs.fail_on #0"),
        ("not_json", "pgbus_workflows.exceptions.PayloadNotSerializable", "must be JSON-serialisable"),
        ("set", "pgbus_workflows.exceptions.PayloadNotSerializable", "must be JSON-serialisable"),
        ("not_installed", "pgbus_workflows.exceptions.ConfigurationError", "not in an installed app"),
        ("lambda", "pgbus_workflows.exceptions.ConfigurationError", "module-level"),
        ("nested", "pgbus_workflows.exceptions.ConfigurationError", "module-level"),
        ("builtin", "pgbus_workflows.exceptions.ConfigurationError", "plain function"),
    ],
)
def test_a_bad_body_return_or_job_argument_is_an_error_through_the_policy_and_writes_no_job(what, error_class, message):
    wf = FanReturns.start(what=what)

    step = run_next(wf)

    assert (step.status, step.outcome) == ("failed", "failed")
    assert step.error_class == error_class
    assert message in step.error_message
    assert "Traceback" in step.traceback
    assert step.fan_out_total is None
    assert wf.status == "paused", "the default policy pauses"
    assert not FanOutJob.objects.exists()
    assert "fan_out_started" not in kinds(wf)


def test_an_oversize_argument_with_on_exception_skip_skips_the_step_without_jobs():
    wf = FanReturnsSkips.start(what="oversize")

    step = run_next(wf)

    assert (step.status, step.error_class) == ("skipped", "pgbus_workflows.exceptions.PayloadTooLarge")
    assert not FanOutJob.objects.exists()
    assert (wf.status, wf.current_step) == ("ready", "after")


def test_a_non_job_return_with_on_exception_cancel_cancels_the_run():
    wf = FanReturnsCancels.start(what="mixed")

    step = run_next(wf)

    assert (step.status, step.outcome, step.error_class) == ("failed", "cancelled", "TypeError")
    assert wf.status == "cancelled"
    assert not FanOutJob.objects.exists()


@pytest.mark.parametrize("what", ["empty", "empty_generator"])
def test_zero_jobs_resolve_at_once(what):
    wf = FanReturns.start(what=what)

    step = run_next(wf)

    assert (step.status, step.outcome) == ("completed", "success")
    assert step.output == {"total": 0, "succeeded": 0, "failed": 0}
    assert step.fan_out_total == 0
    assert (wf.status, wf.current_step) == ("ready", "after")
    assert "fan_out_started" not in kinds(wf)
    completed = events_of(wf, "step_completed")
    assert len(completed) == 1 and completed[0].details["fan_out"] == {"total": 0, "succeeded": 0, "failed": 0}
    assert progress(step) == {"total": 0, "succeeded": 0, "failed": 0, "cancelled": 0, "pending": 0}


def test_ten_thousand_jobs_are_inserted_in_bulk_in_a_bounded_number_of_queries(django_assert_max_num_queries):
    wf = FanMany.start(count=10_000)
    claimed = claim_step(WorkflowStep.objects.get(run=wf.record).pk, "test")

    with django_assert_max_num_queries(25):  # 19 today: ten INSERTs of 1,000 rows
        execute_step(claimed)

    step = WorkflowStep.objects.get(pk=claimed.pk)
    assert (step.status, step.fan_out_total) == ("waiting", 10_000)
    assert FanOutJob.objects.filter(step=step).count() == 10_000
    assert progress(step)["pending"] == 10_000


@pytest.mark.parametrize(
    ("path", "spied"),
    [
        ("os.system", "os.system"),
        ("subprocess.call", "subprocess.call"),
        ("builtins.exec", None),
        ("tests.testapp.jobs.SideEffect", None),
        ("tests.testapp.jobs.no_such_function", None),
        ("tests.testapp.jobs.SideEffect.objects.all", None),
    ],
)
def test_a_job_whose_path_was_tampered_with_is_refused_and_nothing_runs(monkeypatch, path, spied):
    calls = []
    monkeypatch.setattr(os, "system", lambda *a, **k: calls.append(("os.system", a)))
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: calls.append(("subprocess.call", a)))
    wf = FanReturns.start(what="tampered")
    step = run_next(wf)
    FanOutJob.objects.filter(step=step).update(function=path, arguments={"args": ["touch /tmp/pwned"], "kwargs": {}})

    # A dispatcher that cannot import it leaves it for newer code, for UNKNOWN_STEP_GRACE...
    assert claim_due_jobs(10, claimed_by="test") == []
    assert FanOutJob.objects.get(step=step).status == "pending"
    # ... then claims it, and refuses to run it.
    FanOutJob.objects.filter(step=step).update(scheduled_at=timezone.now() - timedelta(minutes=11))
    (job,) = claim_due_jobs(10, claimed_by="test")
    status = execute_job(job)

    assert calls == [], f"{spied} ran"
    assert not SideEffect.objects.exists()
    job.refresh_from_db()
    assert (status, job.status, job.attempts) == ("failed", "failed", 1)
    assert "ConfigurationError" in job.error and path in job.error
    assert job.result is None
    # It was the only job: the step resolved through the policy (pause).
    step.refresh_from_db()
    assert (step.status, step.error_class) == ("failed", "pgbus_workflows.exceptions.FanOutFailed")
    assert wf.reload().status == "paused"


# -- 2. running jobs and resolving -------------------------------------------------------------------


def test_when_every_job_succeeds_the_step_completes_with_the_counts_and_the_next_step_reads_the_results():
    wf = FanSum.start(count=4)
    step = run_next(wf)

    claimed = claim_due_jobs(10, claimed_by="test")
    assert len(claimed) == 4
    for job in reversed(claimed):  # finishing out of order: results still come in job order
        assert execute_job(job) == "succeeded"

    step.refresh_from_db()
    assert (step.status, step.outcome) == ("completed", "success")
    assert step.output == {"total": 4, "succeeded": 4, "failed": 0}
    assert (wf.reload().status, wf.current_step) == ("ready", "total")
    assert [(j.status, j.attempts, j.result, j.claimed_by) for j in jobs_of(step)] == [
        ("succeeded", 1, n * n, "test") for n in range(4)
    ]
    assert all(j.started_at and j.finished_at and j.stall_at is None for j in jobs_of(step))
    assert len(events_of(wf, "step_resolved")) == 1
    assert len(events_of(wf, "step_completed")) == 1

    total = run_next(wf)
    assert total.output == {"sum": 0 + 1 + 4 + 9, "results": [0, 1, 4, 9]}
    assert wf.status == "finished"
    assert sorted(SideEffect.objects.values_list("key", flat=True)) == ["0", "1", "2", "3"]


def test_fan_out_results_of_a_plain_step_is_empty_and_of_an_unknown_step_raises():
    wf = FanPlainStep.start()

    assert run_next(wf).output == {"results": []}
    missing = run_next(wf)

    assert missing.error_class == "pgbus_workflows.exceptions.StepNotDefined"
    assert "no_such_step" in missing.error_message


def test_a_job_is_retried_after_its_timedelta_backoff_and_fails_with_its_traceback_when_spent():
    wf = FanBackoff.start()
    step = run_next(wf)

    before = timezone.now()
    assert run_jobs() == 2
    a, b = jobs_of(step)
    assert (a.status, a.attempts, b.status, b.attempts) == ("pending", 1, "pending", 1)
    assert "RuntimeError: flaky a attempt 1 fails" in a.error
    for job in (a, b):
        assert before + timedelta(seconds=29) < job.scheduled_at < timezone.now() + timedelta(seconds=31)
    assert run_jobs() == 0, "nothing is due during the backoff"

    make_due(step)
    assert run_jobs() == 2
    a, b = jobs_of(step)
    assert (a.status, a.attempts, a.result) == ("succeeded", 2, 2)
    assert (b.status, b.attempts) == ("pending", 2)

    make_due(step)
    assert run_jobs() == 1
    b = jobs_of(step)[1]
    assert (b.status, b.attempts) == ("failed", 3)
    assert b.error.startswith("Traceback (most recent call last):")
    assert "RuntimeError: flaky b attempt 3 fails" in b.error
    assert SideEffect.objects.filter(label="flaky", key="b").count() == 3

    step.refresh_from_db()
    assert (step.status, step.outcome) == ("failed", "failed")
    assert step.error_class == "pgbus_workflows.exceptions.FanOutFailed"
    assert step.error_message == "1 of 2 jobs of work failed"
    assert wf.reload().status == "paused"
    assert events_of(wf, "step_failed")[0].details["fan_out"] == {"total": 2, "succeeded": 1, "failed": 1}


def test_a_callable_backoff_is_asked_with_the_attempt_number():
    BACKOFF_CALLS.clear()
    wf = FanCallableBackoff.start()
    step = run_next(wf)

    waits = []
    for _ in range(2):
        before = timezone.now()
        run_jobs()
        (job,) = jobs_of(step)
        waits.append((job.scheduled_at - before).total_seconds())
        make_due(step)
    run_jobs()

    assert BACKOFF_CALLS == [1, 2]
    assert 9 < waits[0] < 11 and 19 < waits[1] < 21
    (job,) = jobs_of(step)
    assert (job.status, job.attempts) == ("failed", 3)


@pytest.mark.parametrize(
    ("cls", "step_status", "step_outcome", "run_status"),
    [
        (FanFails, "failed", "failed", "paused"),
        (FanFailsSkip, "skipped", "skipped", "ready"),
        (FanFailsCancel, "failed", "cancelled", "cancelled"),
        (FanFailsClassPolicy, "skipped", "skipped", "ready"),
    ],
)
def test_a_failed_job_sends_fan_out_failed_to_the_step_policy(cls, step_status, step_outcome, run_status):
    wf = cls.start()
    step = run_next(wf)

    run_jobs()

    step.refresh_from_db()
    assert (step.status, step.outcome) == (step_status, step_outcome)
    assert step.error_class == "pgbus_workflows.exceptions.FanOutFailed"
    assert step.error_message == "1 of 3 jobs of compute failed"
    assert wf.reload().status == run_status
    failed = next(j for j in jobs_of(step) if j.status == "failed")
    assert failed.index == 1 and "ValueError: job 1 fails on purpose" in failed.error
    if run_status == "paused":
        assert "FanOutFailed: 1 of 3 jobs of compute failed" in wf.record.paused_reason
    if run_status == "ready":
        assert run_next(wf).status == "completed"


def test_on_job_failure_continue_completes_the_step_with_the_counts():
    wf = FanFailsContinue.start()
    step = run_next(wf)

    run_jobs()

    step.refresh_from_db()
    assert (step.status, step.outcome) == ("completed", "success")
    assert step.output == {"total": 3, "succeeded": 2, "failed": 1}
    assert step.error_class == ""
    assert run_next(wf).output == {"results": [0, None, 2]}
    assert wf.status == "finished"


def test_fan_out_failed_with_reattempt_opens_new_jobs_and_pauses_when_reattempts_are_spent():
    wf = FanFailsReattempt.start()
    first = run_next(wf)
    run_jobs()

    first.refresh_from_db()
    assert (first.status, first.outcome, first.error_class) == (
        "failed",
        "reattempted",
        "pgbus_workflows.exceptions.FanOutFailed",
    )
    assert wf.reload().status == "ready"

    second = run_next(wf)
    assert second.attempt == 2 and second.fan_out_total == 2
    assert len(jobs_of(second)) == 2 and len(jobs_of(first)) == 2
    run_jobs()

    second.refresh_from_db()
    assert (second.status, second.outcome) == ("failed", "failed")
    assert wf.reload().status == "paused"
    assert events_of(wf, "step_failed")[-1].details["reattempts_exhausted"] == 1
    # flaky(key, 2) fails twice then succeeds: a resume runs a third fan-out that succeeds.
    wf.resume()
    third = run_next(wf)
    run_jobs()
    third.refresh_from_db()
    assert third.output == {"total": 2, "succeeded": 2, "failed": 0}
    # fan_out_results reads the latest fan-out attempt.
    assert run_next(wf).output == {"results": [3, 3]}


def test_a_job_result_over_the_payload_limit_fails_the_job():
    wf = FanOversizedResult.start()
    step = run_next(wf)

    run_jobs()

    big, small = jobs_of(step)
    assert big.status == "failed" and "PayloadTooLarge" in big.error and big.result is None
    assert (small.status, small.result) == ("succeeded", "x" * 10)
    step.refresh_from_db()
    assert step.output == {"total": 2, "succeeded": 1, "failed": 1}


def test_queue_priority_and_timeout_go_onto_the_jobs():
    wf = FanOptions.start()
    step = run_next(wf)

    assert {(j.queue, j.priority) for j in jobs_of(step)} == {("fanq", 3)}
    assert claim_due_jobs(10, queues=["workflows"]) == []
    claimed = claim_due_jobs(10, queues=["fanq"], claimed_by="q")
    assert len(claimed) == 2
    for job in claimed:
        assert job.stall_at == job.started_at + timedelta(seconds=5)


def test_a_class_step_options_queue_goes_onto_the_jobs():
    wf = FanClassQueue.start()
    step = run_next(wf)

    assert {(j.queue, j.priority) for j in jobs_of(step)} == {("fan-class-q", -2)}


def test_skip_if_skips_a_fan_out_without_jobs_and_wait_delays_it():
    skipped = FanSkipIf.start(skip=True)
    step = run_next(skipped)
    assert step.status == "skipped" and step.fan_out_total is None
    assert not FanOutJob.objects.exists()

    waits = FanWaits.start()
    scheduled = WorkflowStep.objects.get(run=waits.record)
    assert scheduled.scheduled_at > timezone.now() + timedelta(minutes=59)


def test_jobs_are_claimed_once_and_a_second_claim_is_a_no_op():
    wf = FanSum.start(count=3)
    step = run_next(wf)
    first = jobs_of(step)[0]

    assert claim_job(first.pk, "a") is not None
    assert claim_job(first.pk, "b") is None
    assert len(claim_due_jobs(10, claimed_by="c")) == 2
    assert claim_due_jobs(10, claimed_by="c") == []
    assert claim_due_jobs(0) == []


def test_resolve_if_done_is_a_no_op_while_a_job_is_unfinished_and_once_resolved():
    wf = FanSum.start(count=2)
    step = run_next(wf)
    a, b = claim_due_jobs(10, claimed_by="test")
    execute_job(a)

    assert resolve_if_done(step.pk, wf.record.pk) is False
    execute_job(b)  # resolves
    assert resolve_if_done(step.pk, wf.record.pk) is False
    assert len(events_of(wf, "step_resolved")) == 1


# -- 3. the sweep ------------------------------------------------------------------------------------


def lose_completion(step, ago, status="succeeded"):
    """Finish every job behind the engine's back (as if the last job's resolution was lost)."""
    FanOutJob.objects.filter(step_id=step.pk).update(
        status=status, result=1, finished_at=timezone.now() - ago, stall_at=None
    )


def test_the_sweep_resolves_a_fan_out_whose_completion_was_lost():
    wf = FanSum.start(count=3)
    step = run_next(wf)
    lose_completion(step, wf_settings.STALL_THRESHOLD + timedelta(minutes=1))

    summary = Sweeper().run()

    assert summary["lost_fan_outs"] == 1
    step.refresh_from_db()
    assert (step.status, step.output) == ("completed", {"total": 3, "succeeded": 3, "failed": 0})
    assert (wf.reload().status, wf.current_step) == ("ready", "total")
    assert len(events_of(wf, "step_resolved")) == 1
    assert resolve_lost_fan_outs(timezone.now()) == 0, "resolved once"


def test_the_sweep_resolves_a_completion_lost_a_moment_ago_and_leaves_a_paused_run_alone():
    recent = FanSum.start(count=2)
    recent_step = run_next(recent)
    lose_completion(recent_step, timedelta(0))
    paused = FanSum.start(count=2)
    paused_step = run_next(paused)
    lose_completion(paused_step, timedelta(hours=3))
    paused.pause()

    # No STALL_THRESHOLD wait: the next pass resolves it; the paused one waits for resume().
    assert resolve_lost_fan_outs(timezone.now()) == 1

    assert recent.reload().status == "ready" and paused.reload().status == "paused"
    assert resolve_lost_fan_outs(timezone.now()) == 0
    paused.resume()
    assert (paused.reload().status, paused.current_step) == ("ready", "total")


def test_the_sweep_resolves_a_lost_fan_out_with_failed_jobs_through_the_policy():
    wf = FanFails.start()
    step = run_next(wf)
    lose_completion(step, timedelta(hours=2), status="failed")

    assert resolve_lost_fan_outs(timezone.now()) == 1

    step.refresh_from_db()
    assert step.error_message == "3 of 3 jobs of compute failed"
    assert wf.reload().status == "paused"


@override_settings(PGBUS_WORKFLOWS={"MAX_STALLS": 1})
def test_running_jobs_past_stall_at_are_put_back_without_spending_an_attempt_then_failed_after_max_stalls():
    wf = FanRetries.start(count=2)
    step = run_next(wf)
    claimed = claim_due_jobs(10, claimed_by="slow")
    FanOutJob.objects.filter(step=step).update(stall_at=timezone.now() - timedelta(seconds=1))

    summary = Sweeper().run()

    assert summary["stalled_jobs"] == 2
    rows = jobs_of(step)
    assert {(j.status, j.attempts, j.stalls) for j in rows} == {("pending", 0, 1)}  # the claim was no attempt
    assert all("stalled: it ran past its stall_at" in j.error for j in rows)
    # The stalled attempt finishing late changes nothing: its outcome is discarded.
    assert execute_job(claimed[0]) == ""
    assert jobs_of(step)[0].status == "pending"

    again = claim_due_jobs(10, claimed_by="slow")
    assert len(again) == 2
    FanOutJob.objects.filter(step=step).update(stall_at=timezone.now() - timedelta(seconds=1))
    assert recover_jobs(timezone.now()) == 2

    rows = jobs_of(step)
    assert {(j.status, j.attempts, j.stalls) for j in rows} == {("failed", 1, 1)}
    assert all("MAX_STALLS is 1" in j.error for j in rows)
    step.refresh_from_db()
    assert (step.status, step.error_message) == ("failed", "2 of 2 jobs of work failed")
    assert wf.reload().status == "paused"


def test_a_running_job_not_past_stall_at_is_left_alone():
    wf = FanRetries.start(count=1)
    run_next(wf)
    claim_due_jobs(10, claimed_by="busy")

    assert recover_jobs(timezone.now()) == 0
    assert FanOutJob.objects.get().status == "running"


def test_the_jobs_of_a_dead_dispatcher_are_put_back():
    now = timezone.now()
    Dispatcher.objects.create(name="dead-1", hostname="h", pid=1, heartbeat_at=now - timedelta(hours=1))
    Dispatcher.objects.create(name="alive-1", hostname="h", pid=2, heartbeat_at=now)
    wf = FanRetries.start(count=3)
    step = run_next(wf)
    dead_jobs = claim_due_jobs(2, claimed_by="dead-1")
    alive_jobs = claim_due_jobs(1, claimed_by="alive-1")

    summary = Sweeper().run()

    assert summary["dead_dispatchers"] == 2
    for job in dead_jobs:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.stalls) == ("pending", 0, 1)  # a stall, not an attempt
        assert "its dispatcher died" in job.error
    assert FanOutJob.objects.get(pk=alive_jobs[0].pk).status == "running"
    assert list(Dispatcher.objects.values_list("name", flat=True)) == ["alive-1"]
    # They run again elsewhere, and the fan-out completes.
    run_jobs("alive-1")
    execute_job(alive_jobs[0])
    step.refresh_from_db()
    assert step.output == {"total": 3, "succeeded": 3, "failed": 0}
    assert SideEffect.objects.filter(label="fan-job").count() == 3


# -- 4. operator verbs -------------------------------------------------------------------------------


def test_pausing_holds_the_run_while_jobs_go_on_and_resume_resolves():
    wf = FanSum.start(count=2)
    step = run_next(wf)

    wf.pause(reason="look")
    assert run_jobs() == 2, "jobs go on while the run is paused"

    step.refresh_from_db()
    assert step.status == "waiting" and wf.reload().status == "paused"
    assert not events_of(wf, "step_resolved")
    assert progress(step)["succeeded"] == 2
    assert resolve_lost_fan_outs(timezone.now() + timedelta(days=1)) == 0, "the sweep does not resume it"

    wf.resume()

    step.refresh_from_db()
    assert (step.status, step.output) == ("completed", {"total": 2, "succeeded": 2, "failed": 0})
    assert (wf.reload().status, wf.current_step) == ("ready", "total")
    assert kinds(wf)[-4:] == ["paused", "resumed", "step_resolved", "step_completed"]


def test_resume_before_the_jobs_end_goes_back_to_waiting_and_the_last_job_resolves():
    wf = FanSum.start(count=2)
    step = run_next(wf)
    wf.pause()
    claim_due_jobs(1, claimed_by="test")
    wf.resume()

    assert wf.reload().status == "waiting"
    run_jobs()
    for job in FanOutJob.objects.filter(status="running"):
        execute_job(job)

    assert WorkflowStep.objects.get(pk=step.pk).status == "completed"
    assert wf.reload().status == "ready"


def test_a_fan_out_opened_while_the_run_was_paused_is_held():
    wf = FanSum.start(count=2)
    claimed = claim_step(WorkflowStep.objects.get(run=wf.record).pk, "test")
    wf.pause(reason="while performing")
    execute_step(claimed)

    assert wf.reload().status == "paused"
    started = events_of(wf, "fan_out_started")[0]
    assert (started.transition, started.to_status) == ("hold", "paused")
    run_jobs()
    assert wf.reload().status == "paused"
    wf.resume()
    assert (wf.reload().status, wf.current_step) == ("ready", "total")


def test_cancelling_the_run_cancels_pending_jobs_and_a_running_job_finishes_unused():
    wf = FanSum.start(count=3)
    step = run_next(wf)
    (running,) = claim_due_jobs(1, claimed_by="test")

    wf.cancel(reason="stop")

    assert wf.reload().status == "cancelled"
    step.refresh_from_db()
    assert step.status == "cancelled"
    assert sorted(j.status for j in jobs_of(step)) == ["cancelled", "cancelled", "running"]
    assert claim_due_jobs(10) == []

    assert execute_job(running) == "succeeded"

    assert wf.reload().status == "cancelled"
    assert WorkflowStep.objects.filter(run=wf.record).count() == 1
    assert not events_of(wf, "step_resolved")
    assert progress(step) == {"total": 3, "succeeded": 1, "failed": 0, "cancelled": 2, "pending": 0}


@pytest.mark.parametrize("verb", ["cancel", "skip"])
def test_a_running_job_that_fails_after_the_run_was_cancelled_or_skipped_is_not_retried(verb):
    wf = FanFlakyRetries.start(count=1)
    run_next(wf)
    (running,) = claim_due_jobs(1, claimed_by="test")
    getattr(wf, verb)()

    execute_job(running)  # flaky: fails on its first call, and has a second attempt

    assert claim_due_jobs(10) == [], f"a job of a fan-out ended by {verb} must not run again"
    assert FanOutJob.objects.get().status in ("failed", "cancelled")


def test_a_stalled_job_of_a_cancelled_run_is_not_put_back():
    wf = FanRetries.start(count=1)
    run_next(wf)
    claim_due_jobs(1, claimed_by="test")
    wf.cancel()
    FanOutJob.objects.update(stall_at=timezone.now() - timedelta(seconds=1))

    recover_jobs(timezone.now())

    assert claim_due_jobs(10) == [], "a job of a cancelled run must not run again"


def test_skip_on_a_waiting_fan_out_resolves_it_as_skipped_and_cancels_pending_jobs():
    wf = FanSum.start(count=3)
    step = run_next(wf)
    (running,) = claim_due_jobs(1, claimed_by="test")

    wf.skip(actor="alice", reason="not needed")

    step.refresh_from_db()
    assert (step.status, step.outcome) == ("skipped", "skipped")
    assert (wf.reload().status, wf.current_step) == ("ready", "total")
    assert sorted(j.status for j in jobs_of(step)) == ["cancelled", "cancelled", "running"]
    skipped = events_of(wf, "step_skipped")
    assert len(skipped) == 1 and skipped[0].actor == "alice"

    execute_job(running)  # ends later: nothing more moves
    assert WorkflowStep.objects.filter(run=wf.record).count() == 2
    assert wf.reload().status == "ready"
    assert len(events_of(wf, "step_resolved")) == 1


def test_skip_on_a_paused_run_waiting_on_a_fan_out_cancels_its_jobs_and_moves_on():
    wf = FanSum.start(count=2)
    step = run_next(wf)
    wf.pause()

    wf.skip()

    step.refresh_from_db()
    assert step.status == "skipped"
    assert {j.status for j in jobs_of(step)} == {"cancelled"}
    assert (wf.reload().status, wf.current_step) == ("ready", "total")


def test_resume_at_cancels_the_pending_jobs_of_the_waiting_fan_out():
    wf = FanSum.start(count=2)
    step = run_next(wf)
    wf.pause()

    wf.resume_at("total")

    assert WorkflowStep.objects.get(pk=step.pk).status == "cancelled"
    assert {j.status for j in jobs_of(step)} == {"cancelled"}
    assert run_next(wf).output == {"sum": 0, "results": [None, None]}


# -- 6. progress -------------------------------------------------------------------------------------


def test_progress_counts_the_jobs_by_state():
    wf = FanFails.start(bad=[1])
    step = run_next(wf)
    assert progress(step) == {"total": 3, "succeeded": 0, "failed": 0, "cancelled": 0, "pending": 3}

    first, second = claim_due_jobs(2, claimed_by="test")
    execute_job(first)
    assert progress(step) == {"total": 3, "succeeded": 1, "failed": 0, "cancelled": 0, "pending": 2}
    execute_job(second)
    assert progress(step) == {"total": 3, "succeeded": 1, "failed": 1, "cancelled": 0, "pending": 1}

    assert cancel_pending_jobs(step) == 1
    assert progress(step) == {"total": 3, "succeeded": 1, "failed": 1, "cancelled": 1, "pending": 0}
    assert progress(step)["total"] == 3


# -- 5. the test helper ------------------------------------------------------------------------------


class CompleteFanOutTests(WorkflowTestMixin, TestCase):
    def test_runs_every_job_through_the_executor_then_resolves(self):
        wf = FanSum.start(count=4)
        self.perform_next_step(wf)

        self.complete_fan_out(wf)

        self.assertEqual(sorted(SideEffect.objects.values_list("key", flat=True)), ["0", "1", "2", "3"])
        step = WorkflowStep.objects.get(run=wf.record, step_name="compute")
        self.assertEqual(step.output, {"total": 4, "succeeded": 4, "failed": 0})
        self.assertEqual(set(FanOutJob.objects.values_list("claimed_by", flat=True)), {"test_helpers"})
        self.perform_next_step(wf)
        self.assertWorkflowStatus(wf, "finished")
        self.assertStepsCompleted(wf, ["compute", "total"])
        self.assertEqual(
            WorkflowStep.objects.get(run=wf.record, step_name="total").output, {"sum": 14, "results": [0, 1, 4, 9]}
        )

    def test_failures_are_respected(self):
        wf = FanFails.start()
        self.perform_next_step(wf)

        self.complete_fan_out(wf)

        self.assertWorkflowStatus(wf, "paused")
        step = WorkflowStep.objects.get(run=wf.record, step_name="compute")
        self.assertEqual(step.error_class, "pgbus_workflows.exceptions.FanOutFailed")

    def test_on_job_failure_continue_goes_on(self):
        wf = FanFailsContinue.start()
        self.perform_next_step(wf)
        self.complete_fan_out(wf)
        self.speedrun_workflow(wf)

        self.assertWorkflowStatus(wf, "finished")
        self.assertEqual(WorkflowStep.objects.get(run=wf.record, step_name="after").output, {"results": [0, None, 2]})

    def test_a_job_with_attempts_left_is_retried_at_once_ignoring_the_backoff(self):
        wf = FanBackoff.start()
        self.perform_next_step(wf)

        self.complete_fan_out(wf)

        a, b = FanOutJob.objects.order_by("index")
        self.assertEqual((a.status, a.attempts, b.status, b.attempts), ("succeeded", 2, "failed", 3))
        self.assertWorkflowStatus(wf, "paused")

    def test_zero_jobs_need_no_helper(self):
        wf = FanReturns.start(what="empty")
        self.perform_next_step(wf)
        self.assertWorkflowStatus(wf, "ready")
        with self.assertRaisesMessage(TestHelperError, "is not waiting on a fan-out"):
            self.complete_fan_out(wf)

    def test_raises_when_the_run_is_not_waiting_on_a_fan_out(self):
        wf = FanSum.start(count=1)
        with self.assertRaisesMessage(TestHelperError, "is not waiting on a fan-out"):
            self.complete_fan_out(wf)  # ready: the fan-out has not opened yet
        self.perform_next_step(wf)
        self.complete_fan_out(wf)
        self.speedrun_workflow(wf)
        with self.assertRaisesMessage(TestHelperError, "is not waiting on a fan-out"):
            self.complete_fan_out(wf)  # finished

    def test_speedrun_stops_at_a_fan_out_naming_complete_fan_out(self):
        wf = FanSum.start(count=1)
        with self.assertRaises(StepWaiting) as caught:
            self.speedrun_workflow(wf)
        self.assertIn("complete_fan_out", str(caught.exception))
        self.assertNotIn("for signal", str(caught.exception))


# -- races (real threads, real transactions) ---------------------------------------------------------


def at_barrier(barrier, work, *args):
    barrier.wait(JOIN_TIMEOUT)
    return work(*args)


@pytest.mark.django_db(transaction=True)
def test_two_workers_finishing_the_last_two_jobs_at_once_resolve_the_step_exactly_once():
    for round_ in range(20):
        name = f"race-{round_}"
        job_module.BARRIERS[name] = threading.Barrier(2)
        try:
            wf = FanMeetLocal.start(barrier=name)
            step = run_next(wf)
            claimed = claim_due_jobs(2, claimed_by="test")
            assert len(claimed) == 2
            barrier = threading.Barrier(2)
            workers = [Worker(at_barrier, barrier, execute_job, job) for job in claimed]
            for worker in workers:
                worker.start()
            statuses = [worker.finish() for worker in workers]
        finally:
            job_module.BARRIERS.pop(name, None)

        assert statuses == ["succeeded", "succeeded"], f"round {round_}"
        step.refresh_from_db()
        assert (step.status, step.output) == ("completed", {"total": 2, "succeeded": 2, "failed": 0})
        assert len(events_of(wf, "step_resolved")) == 1, f"round {round_}: resolved twice"
        assert len(events_of(wf, "step_completed")) == 1, f"round {round_}"
        assert WorkflowStep.objects.filter(run=wf.record, step_name="after").count() == 1, f"round {round_}"
        assert (wf.reload().status, wf.current_step) == ("ready", "after")
        assert [j.status for j in jobs_of(step)] == ["succeeded", "succeeded"]
        assert run_next(wf).output == {"results": [0, 1]}


@pytest.mark.django_db(transaction=True)
def test_pause_racing_the_last_job_loses_nothing_and_resume_resolves_exactly_once():
    for round_ in range(10):
        wf = FanSum.start(count=1)
        step = run_next(wf)
        (job,) = claim_due_jobs(1, claimed_by="test")
        barrier = threading.Barrier(2)
        finisher = Worker(at_barrier, barrier, execute_job, job)
        pauser = Worker(at_barrier, barrier, wf.pause)
        finisher.start()
        pauser.start()
        assert finisher.finish() == "succeeded"
        pauser.finish()

        assert wf.reload().status == "paused", f"round {round_}"
        wf.resume()

        step.refresh_from_db()
        assert (step.status, step.output) == ("completed", {"total": 1, "succeeded": 1, "failed": 0}), round_
        assert len(events_of(wf, "step_resolved")) == 1, f"round {round_}"
        assert WorkflowStep.objects.filter(run=wf.record, step_name="total").count() == 1, f"round {round_}"
        assert (wf.reload().status, wf.current_step) == ("ready", "total")


@pytest.mark.django_db(transaction=True)
def test_a_job_that_ran_while_the_connection_dropped_is_recorded_after_reconnecting():
    wf = FanDropsConnection.start()
    step = run_next(wf)
    (job,) = claim_due_jobs(1, claimed_by="test")

    try:
        status = execute_job(job)
    except OperationalError:
        connection.close()  # the test database is flushed through this connection afterwards
        raise

    assert status == "succeeded"
    assert WorkflowStep.objects.get(pk=step.pk).status == "completed"
    assert SideEffect.objects.filter(label="dropped").count() == 1
