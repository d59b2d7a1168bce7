"""``backoff()``: the exponential wait with full jitter, alone and through the engine (policies, fan-out jobs)."""

import dataclasses
import random
from datetime import timedelta
from itertools import pairwise

import pytest

import pgbus_workflows.dsl.backoff as backoff_module
from pgbus_workflows import ConfigurationError, Job, OnException, Workflow, backoff, fan_out, step
from pgbus_workflows.dsl.backoff import MAX_BACKOFF
from pgbus_workflows.models import FanOutJob
from pgbus_workflows.services.fanout import claim_due_jobs, execute_job
from pgbus_workflows.sql import clock
from tests.support import CLOCK_SLACK, events_of, run_next, scheduled, steps_of
from tests.testapp.jobs import flaky


def seconds(*values):
    """The timedeltas of ``values`` seconds."""
    return [timedelta(seconds=v) for v in values]


# -- workflows -------------------------------------------------------------------------------------


class BackoffOcr(Workflow):
    """The steps guide's example, without jitter and with a short max: times out on its first six attempts."""

    name = "dsl_backoff_ocr"
    step_options = {"queue": "dsl-backoff"}

    @step(
        on_exception=OnException(
            TimeoutError,
            action="reattempt",
            max_reattempts=8,
            wait=backoff(base=timedelta(seconds=1), factor=2, max=timedelta(seconds=10), jitter=False),
        )
    )
    def ocr(self):
        if self.attempt <= 6:
            raise TimeoutError(f"attempt {self.attempt}")
        return {"attempt": self.attempt}


class BackoffJittered(Workflow):
    """Full jitter through the engine: times out on its first four attempts."""

    name = "dsl_backoff_jittered"
    step_options = {"queue": "dsl-backoff"}

    @step(on_exception=OnException(TimeoutError, action="reattempt", wait=backoff(base=60, factor=3)))
    def call(self):
        if self.attempt <= 4:
            raise TimeoutError(f"attempt {self.attempt}")


class BackoffLongest(Workflow):
    """A backoff as long as any gives: the attempt is still scheduled and stored."""

    name = "dsl_backoff_longest"
    step_options = {"queue": "dsl-backoff"}

    @step(on_exception=OnException(TimeoutError, action="reattempt", wait=backoff(base=MAX_BACKOFF, jitter=False)))
    def call(self):
        if self.attempt == 1:
            raise TimeoutError("first")


class BackoffJobs(Workflow):
    """A fan-out job that fails four times: its retries back off by 10 s, 30 s, then 90 s."""

    name = "dsl_backoff_jobs"
    step_options = {"queue": "dsl-backoff"}

    @fan_out(max_attempts=4, backoff=backoff(base=timedelta(seconds=10), factor=3, jitter=False))
    def work(self):
        return [Job(flaky, f"dsl-backoff:{self.workflow_id}", 4)]


# -- the sequence ------------------------------------------------------------------------------------


def test_without_jitter_attempt_n_waits_base_times_factor_to_the_n_minus_1_capped_at_max():
    wait = backoff(base=timedelta(seconds=1), factor=2, max=timedelta(minutes=5), jitter=False)

    assert [wait(n) for n in range(1, 12)] == seconds(1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300)


def test_durations_may_be_seconds_the_factor_a_float_or_1_and_max_equal_to_base():
    assert [backoff(0.5, factor=1.5, jitter=False)(n) for n in (1, 2, 3)] == seconds(0.5, 0.75, 1.125)
    assert {backoff(7, factor=1, jitter=False)(n) for n in (1, 2, 100)} == {timedelta(seconds=7)}
    assert backoff(30, max=30, jitter=False)(5) == timedelta(seconds=30)


def test_the_default_factor_is_2_and_jitter_is_on():
    made = backoff(base=3)

    assert (made.factor, made.jitter, made.max) == (2, True, None)
    assert [made.ceiling(n) for n in (1, 2, 3)] == seconds(3, 6, 12)


def test_a_large_attempt_number_gives_max_or_without_max_stops_at_max_backoff():
    assert backoff(1, factor=2, max=60, jitter=False)(10_000) == timedelta(seconds=60)
    assert backoff(1, factor=2, jitter=False)(10_000) == MAX_BACKOFF == timedelta(days=3660)
    assert backoff(1, factor=1.000001, jitter=False)(10**12) == MAX_BACKOFF
    assert backoff(1, factor=10**400, jitter=False)(2) == MAX_BACKOFF
    assert timedelta(0) <= backoff(1)(10**12) <= MAX_BACKOFF  # jittered, below the same cap


def test_the_ceiling_reaches_max_backoff_at_the_attempt_where_the_power_passes_it():
    made = backoff(1, jitter=False)
    crossing = next(n for n in range(1, 100) if 2 ** (n - 1) > MAX_BACKOFF.total_seconds())

    assert made(crossing - 1) == timedelta(seconds=2 ** (crossing - 2)) < MAX_BACKOFF
    assert made(crossing) == MAX_BACKOFF


# -- full jitter -------------------------------------------------------------------------------------


def test_full_jitter_draws_uniformly_between_0_and_the_ceiling():
    wait = backoff(base=10, factor=2, max=60)
    draws = [wait(3).total_seconds() for _ in range(4000)]  # ceiling 40 s

    assert all(0 <= d <= 40 for d in draws)
    assert len(set(draws)) > 3900  # spread, not one value
    assert 19 < sum(draws) / len(draws) < 21  # uniform: mean 20, standard error 0.18
    assert min(draws) < 2 and max(draws) > 38  # both ends reached: full jitter, not "ceiling plus noise"


def test_full_jitter_at_the_cap_stays_within_max():
    wait = backoff(base=1, max=5)

    assert all(timedelta(0) <= wait(10_000) <= timedelta(seconds=5) for _ in range(1000))


def test_full_jitter_is_random_uniform_from_0_to_the_ceiling(monkeypatch):
    monkeypatch.setattr(backoff_module, "random", random.Random(42))
    expected = random.Random(42)
    wait = backoff(base=timedelta(seconds=2), factor=2, max=timedelta(seconds=12))

    assert [wait(n) for n in (1, 2, 3, 4)] == [timedelta(seconds=expected.uniform(0, c)) for c in (2, 4, 8, 12)]


# -- the object --------------------------------------------------------------------------------------


def test_a_backoff_is_frozen_comparable_and_has_a_readable_repr():
    made = backoff(base=timedelta(seconds=1), factor=2, max=timedelta(minutes=5))

    assert repr(made) == "backoff(base=timedelta(seconds=1), factor=2, max=timedelta(seconds=300), jitter=True)"
    assert repr(backoff(0.25, factor=1.5, jitter=False)) == (
        "backoff(base=timedelta(seconds=0.25), factor=1.5, max=None, jitter=False)"
    )
    assert made == backoff(1, max=300)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.factor = 3


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base": 0}, r"backoff base must be a positive, finite duration, got 0$"),
        ({"base": -1}, r"backoff base must be a positive, finite duration, got -1$"),
        ({"base": timedelta(0)}, r"backoff base must be a positive, finite duration, got datetime\.timedelta\(0\)$"),
        ({"base": timedelta(seconds=-5)}, r"backoff base must be a positive, finite duration"),
        ({"base": float("nan")}, r"backoff base must be a positive, finite duration, got nan$"),
        ({"base": float("inf")}, r"backoff base must be a positive, finite duration, got inf$"),
        ({"base": 1e-7}, r"backoff base must be at least 1 microsecond, got 1e-07$"),
        ({"base": timedelta(days=3661)}, r"backoff base must be at most 3660 days"),
        ({"base": 10**400}, r"backoff base must be at most 3660 days"),
        ({"base": True}, r"backoff base must be a timedelta or a number of seconds, got True$"),
        ({"base": "1"}, r"backoff base must be a timedelta or a number of seconds, got '1'$"),
        ({"base": None}, r"backoff base must be a timedelta or a number of seconds, got None$"),
        ({"base": 1, "factor": 0.5}, r"backoff factor must be a finite number of at least 1, got 0\.5$"),
        ({"base": 1, "factor": 0}, r"backoff factor must be a finite number of at least 1, got 0$"),
        ({"base": 1, "factor": -2}, r"backoff factor must be a finite number of at least 1, got -2$"),
        ({"base": 1, "factor": float("nan")}, r"backoff factor must be a finite number of at least 1, got nan$"),
        ({"base": 1, "factor": float("inf")}, r"backoff factor must be a finite number of at least 1, got inf$"),
        ({"base": 1, "factor": True}, r"backoff factor must be a finite number of at least 1, got True$"),
        ({"base": 1, "factor": "2"}, r"backoff factor must be a finite number of at least 1, got '2'$"),
        ({"base": 1, "max": 0}, r"backoff max must be a positive, finite duration, got 0$"),
        ({"base": 1, "max": -5}, r"backoff max must be a positive, finite duration, got -5$"),
        ({"base": 1, "max": float("nan")}, r"backoff max must be a positive, finite duration, got nan$"),
        ({"base": 1, "max": timedelta(days=4000)}, r"backoff max must be at most 3660 days"),
        ({"base": 1, "max": False}, r"backoff max must be a timedelta or a number of seconds, got False$"),
        (
            {"base": timedelta(minutes=1), "max": 30},
            r"backoff max must not be shorter than base, got max=30 and base=datetime\.timedelta\(seconds=60\)$",
        ),
        ({"base": 1, "jitter": 1}, r"backoff jitter must be True or False, got 1$"),
        ({"base": 1, "jitter": None}, r"backoff jitter must be True or False, got None$"),
        ({"base": 1, "jitter": "yes"}, r"backoff jitter must be True or False, got 'yes'$"),
    ],
)
def test_bad_input_raises_configuration_error_naming_the_argument(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        backoff(**kwargs)


def test_bad_input_fails_when_the_class_is_defined():
    with pytest.raises(ConfigurationError, match="backoff factor must be a finite number of at least 1"):

        class BadBackoff(Workflow):
            name = "dsl_backoff_bad"

            @step(on_exception=OnException(TimeoutError, action="reattempt", wait=backoff(1, factor=0.5)))
            def call(self):
                pass


# -- through the engine ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_each_reattempt_is_scheduled_the_backoff_of_its_number_after_the_failure():
    wf = BackoffOcr.start()

    for _ in range(7):
        run_next(wf)

    rows = steps_of(wf)
    assert [later.scheduled_at - failed.finished_at for failed, later in pairwise(rows)] == seconds(1, 2, 4, 8, 10, 10)
    assert [(r.attempt, r.outcome, r.reattempt_reason, r.error_class) for r in rows[:-1]] == [
        (n, "reattempted", "exception_policy", "TimeoutError") for n in range(1, 7)
    ]
    assert (rows[-1].attempt, rows[-1].status, rows[-1].output) == (7, "completed", {"attempt": 7})
    events = events_of(wf, "step_reattempted")
    assert [(e.details["next_attempt"], e.details["wait_seconds"]) for e in events] == [
        (2, 1.0),
        (3, 2.0),
        (4, 4.0),
        (5, 8.0),
        (6, 10.0),
        (7, 10.0),
    ]
    assert wf.status == "finished"


@pytest.mark.django_db
def test_with_full_jitter_each_reattempt_waits_a_uniform_draw_up_to_its_ceiling(monkeypatch):
    monkeypatch.setattr(backoff_module, "random", random.Random(7))
    expected = random.Random(7)
    wf = BackoffJittered.start()

    waits = []
    for _ in range(4):
        failed = run_next(wf)
        waits.append(scheduled(wf).scheduled_at - failed.finished_at)
    run_next(wf)

    ceilings = (60, 180, 540, 1620)
    assert waits == [timedelta(seconds=expected.uniform(0, c)) for c in ceilings]
    assert all(timedelta(0) <= w <= timedelta(seconds=c) for w, c in zip(waits, ceilings, strict=True))
    assert [e.details["wait_seconds"] for e in events_of(wf, "step_reattempted")] == [w.total_seconds() for w in waits]
    assert wf.status == "finished"


@pytest.mark.django_db
def test_the_longest_backoff_is_scheduled_and_stored():
    wf = BackoffLongest.start()

    failed = run_next(wf)

    again = scheduled(wf)
    assert (again.attempt, again.scheduled_at - failed.finished_at) == (2, MAX_BACKOFF)


@pytest.mark.django_db
def test_a_fan_out_job_retries_after_the_backoff_of_its_attempt_number():
    wf = BackoffJobs.start()
    fan = run_next(wf)

    waits = []
    for _ in range(3):
        before = clock.now()
        [job] = claim_due_jobs(10, claimed_by="test")
        execute_job(job)
        after = clock.now()
        job = FanOutJob.objects.get(pk=job.pk)
        assert (job.status, job.attempts) == ("pending", len(waits) + 1)
        assert claim_due_jobs(10, claimed_by="test") == []  # not due before its backoff
        waits.append((before - CLOCK_SLACK, job.scheduled_at, after + CLOCK_SLACK))
        FanOutJob.objects.filter(pk=job.pk).update(scheduled_at=clock.now())
    [job] = claim_due_jobs(10, claimed_by="test")
    execute_job(job)

    for (earliest, at, latest), wait in zip(waits, seconds(10, 30, 90), strict=True):
        assert earliest + wait <= at <= latest + wait
    job = FanOutJob.objects.get(step_id=fan.pk)
    assert (job.status, job.attempts) == ("failed", 4)
