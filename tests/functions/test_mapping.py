"""``ctx.map``: a fan-out of jobs from a durable function; the run parks until they ended, then replays.

Run in process with the test helpers (``complete_fan_out`` runs the jobs through the real job
executor); everything is asserted on the rows.
"""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from pgbus_workflows import OnException, StepFailed, backoff, durable
from pgbus_workflows.models import FanOutJob, WorkflowStep
from pgbus_workflows.services import claims
from pgbus_workflows.services.fanout import claim_job, execute_job
from pgbus_workflows.sql import clock
from pgbus_workflows.states import JobStatus, RunStatus, StepStatus
from tests.support import events_of, steps_of
from tests.testapp.jobs import odd_fails, square
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db


def calls(label):
    return sorted(int(key) for key in SideEffect.objects.filter(label=label).values_list("key", flat=True))


@durable(name="map_squares", allow_multiple=True)
def squares(ctx, numbers):
    values = ctx.map("squares", square, numbers)
    return {"sum": ctx.step("sum", lambda: sum(values)), "values": values}


@durable(name="map_twice", allow_multiple=True)
def twice(ctx):
    first = ctx.map("batch", square, [1, 2])
    second = ctx.map("batch", square, [3])
    return first + second


@durable(name="map_fails", allow_multiple=True)
def fails(ctx, numbers):
    return ctx.map("tens", odd_fails, numbers)


@durable(name="map_continues", allow_multiple=True)
def continues(ctx, numbers):
    return ctx.map("tens", odd_fails, numbers, on_job_failure="continue", max_attempts=2)


@durable(name="map_raises", allow_multiple=True)
def raises(ctx, numbers):
    try:
        return ctx.map("tens", odd_fails, numbers, on_exception="raise")
    except StepFailed as failure:
        return {"failed": failure.step, "type": failure.exception_type, "message": failure.message}


@durable(name="map_reattempts", allow_multiple=True)
def reattempts(ctx, numbers):
    policy = OnException(action="reattempt", max_reattempts=1)
    return ctx.map("tens", odd_fails, numbers, on_exception=policy)


@durable(name="map_lambda", allow_multiple=True)
def with_a_lambda(ctx):
    return ctx.map("bad", lambda n: n, [1])


def run_to_fan_out(helpers, run):
    """Run the function until it parks on a fan-out; that fan-out's row."""
    while run.reload().status == RunStatus.READY:
        helpers.perform_next_step(run)
    assert run.reload().status == RunStatus.WAITING
    return WorkflowStep.objects.get(run_id=run.record.pk, status=StepStatus.WAITING)


def test_map_parks_on_one_job_per_item_then_returns_the_results_in_item_order(helpers):
    run = squares.start(None, numbers=[3, 1, 2])
    parked = run_to_fan_out(helpers, run)
    assert (parked.step_name, parked.fan_out_total) == ("squares", 3)
    jobs = list(FanOutJob.objects.filter(step=parked).order_by("index").values_list("function", "arguments"))
    assert jobs == [("tests.testapp.jobs.square", {"args": [n], "kwargs": {}}) for n in (3, 1, 2)]
    assert not WorkflowStep.objects.filter(run_id=run.record.pk, status=StepStatus.IN_PROGRESS).exists()
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"sum": 14, "values": [9, 1, 4]}
    assert calls("square") == [1, 2, 3]  # each job ran once: the replays read the recorded results
    mapped = [s for s in steps_of(run) if s.step_name == "squares"]
    assert [(s.status, s.output, s.fan_out_total) for s in mapped] == [(StepStatus.COMPLETED, [9, 1, 4], 3)]
    assert [e.details["fan_out"] for e in events_of(run, "fan_out_ended")] == [
        {"total": 3, "succeeded": 3, "failed": 0}
    ]


def test_a_map_of_no_items_records_an_empty_list_without_parking(helpers):
    run = squares.start(None, numbers=[])
    helpers.speedrun_workflow(run)
    assert run.result() == {"sum": 0, "values": []}
    assert not FanOutJob.objects.filter(run_id=run.record.pk).exists()


def test_repeated_map_names_are_numbered(helpers):
    run = twice.start(None)
    for _ in range(2):
        run_to_fan_out(helpers, run)
        helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.result() == [1, 4, 9]
    assert [s.step_name for s in steps_of(run) if s.fan_out_total] == ["batch", "batch#2"]


def test_a_failed_job_pauses_the_run_at_the_map_by_default_and_resume_runs_every_job_again(helpers):
    run = fails.start(None, numbers=[2, 3])
    run_to_fan_out(helpers, run)
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    failed = steps_of(run)[-1]
    assert (failed.step_name, failed.error_class) == ("tens", "pgbus_workflows.exceptions.FanOutFailed")
    assert failed.error_message.startswith("1 of 2 jobs of tens failed (first: ValueError: 3 is odd)")
    run.resume()
    helpers.perform_next_step(run)
    assert run.reload().status == RunStatus.WAITING
    assert calls("odd_fails") == [2, 3]  # the new attempt's jobs are not run yet
    helpers.complete_fan_out(run)
    assert calls("odd_fails") == [2, 2, 3, 3]


def test_on_job_failure_continue_gives_none_for_a_job_that_failed_its_attempts(helpers):
    run = continues.start(None, numbers=[1, 2])
    run_to_fan_out(helpers, run)
    assert set(FanOutJob.objects.filter(run_id=run.record.pk).values_list("max_attempts", flat=True)) == {2}
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.result() == [None, 20]
    assert calls("odd_fails") == [1, 1, 2]  # the odd one had two attempts
    statuses = FanOutJob.objects.filter(run_id=run.record.pk).order_by("index").values_list("status", flat=True)
    assert list(statuses) == [JobStatus.FAILED, JobStatus.SUCCEEDED]


def test_on_exception_raise_raises_step_failed_into_the_function_then_and_on_every_replay(helpers):
    run = raises.start(None, numbers=[1])
    run_to_fan_out(helpers, run)
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    expected = {
        "failed": "tens",
        "type": "pgbus_workflows.exceptions.FanOutFailed",
        "message": "1 of 1 jobs of tens failed (first: ValueError: 1 is odd)",
    }
    assert run.result() == expected
    mapped = next(s for s in steps_of(run) if s.step_name == "tens")
    assert mapped.status == StepStatus.FAILED


def test_a_reattempt_policy_opens_the_jobs_again_and_counts_its_reattempts(helpers):
    run = reattempts.start(None, numbers=[1])
    run_to_fan_out(helpers, run)
    helpers.complete_fan_out(run)
    run_to_fan_out(helpers, run)  # the policy's reattempt runs the function, which opens the jobs again
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED  # max_reattempts=1 spent: its terminal action
    assert calls("odd_fails") == [1, 1]
    assert [s.attempt for s in steps_of(run) if s.step_name == "tens"] == [1, 2]


def test_a_lambda_is_refused_with_a_configuration_error_naming_the_map(helpers):
    run = with_a_lambda.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.PAUSED
    failed = steps_of(run)[-1]
    assert failed.error_class == "pgbus_workflows.exceptions.ConfigurationError"
    assert "ctx.map('bad')" in failed.error_message
    assert "module-level function" in failed.error_message


def test_unknown_options_and_bad_values_are_refused(helpers):
    @durable(name="map_bad_option", allow_multiple=True)
    def bad(ctx):
        return ctx.map("x", square, [1], backof=3)

    run = bad.start(None)
    helpers.speedrun_workflow(run)
    assert (
        "ctx.map takes max_attempts, backoff, on_job_failure, on_exception, not backof"
        in steps_of(run)[-1].error_message
    )


def test_workflows_show_gives_the_map_checkpoint_its_job_counts(helpers):
    run = squares.start(None, numbers=[1, 2])
    run_to_fan_out(helpers, run)
    out = StringIO()
    call_command("workflows", "show", str(run.workflow_id), stdout=out)
    assert "fan-out 0/2 done, 0 failed, 0 cancelled, 2 pending" in out.getvalue()
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    out = StringIO()
    call_command("workflows", "show", str(run.workflow_id), stdout=out)
    assert "fan-out 2/2 done, 0 failed, 0 cancelled, 0 pending" in out.getvalue()


def test_a_replay_returns_the_recorded_results_without_reading_a_job(helpers):
    run = twice.start(None)
    run_to_fan_out(helpers, run)
    helpers.complete_fan_out(run)
    run_to_fan_out(helpers, run)  # the first map is recorded; the second parks
    FanOutJob.objects.filter(step__step_name="batch", run_id=run.record.pk).delete()
    helpers.complete_fan_out(run)
    helpers.speedrun_workflow(run)
    assert run.result() == [1, 4, 9]


def test_a_dispatcher_dying_as_the_function_reads_the_ends_runs_no_job_again(helpers):
    run = squares.start(None, numbers=[1, 2])
    run_to_fan_out(helpers, run)
    helpers.complete_fan_out(run)
    woken = WorkflowStep.objects.get(run_id=run.record.pk, status=StepStatus.SCHEDULED)
    assert woken.step_name == "squares"
    claimed = claims.claim_step(woken.pk, claimed_by="doomed")
    assert claimed is not None
    assert claims.stall(claimed.pk, run.record.pk, detection="dispatcher_dead")  # as the sweep finds it
    helpers.speedrun_workflow(run)
    assert run.result() == {"sum": 5, "values": [1, 4]}
    assert calls("square") == [1, 2]
    attempts = [(s.attempt, s.outcome, s.fan_out_total) for s in steps_of(run) if s.step_name == "squares"]
    assert attempts == [(1, "stalled", 2), (2, "success", None)]


@durable(name="map_backs_off", allow_multiple=True)
def backs_off(ctx, numbers, spec):
    wait = timedelta(seconds=spec) if isinstance(spec, int) else backoff(base=timedelta(seconds=20), jitter=False)
    return ctx.map("tens", odd_fails, numbers, max_attempts=2, backoff=wait)


@pytest.mark.parametrize(("spec", "seconds"), [(30, 30), ("backoff", 20)])
def test_a_failed_job_is_retried_after_the_backoff_its_row_stores(helpers, spec, seconds):
    run = backs_off.start(None, numbers=[1], spec=spec)
    parked = run_to_fan_out(helpers, run)
    (job,) = FanOutJob.objects.filter(step=parked)
    assert "backoff" in job.arguments  # whichever process ends the attempt reads it there
    before = clock.now()
    assert execute_job(claim_job(job.pk)) == JobStatus.PENDING
    job.refresh_from_db()
    assert before + timedelta(seconds=seconds - 1) < job.scheduled_at <= clock.now() + timedelta(seconds=seconds)


def test_a_backoff_callable_other_than_backoff_is_refused(helpers):
    @durable(name="map_backoff_callable", allow_multiple=True)
    def bad(ctx):
        return ctx.map("x", square, [1], backoff=lambda attempt: attempt)

    run = bad.start(None)
    helpers.speedrun_workflow(run)
    assert "ctx.map(backoff=) takes a duration or a backoff(...)" in steps_of(run)[-1].error_message
