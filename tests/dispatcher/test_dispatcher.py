"""Real ``run_workflow_dispatcher`` processes against PostgreSQL: drain, scale out, signals, crashes."""

import signal
from collections import Counter

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from pgbus_workflows.dispatcher import WorkflowDispatcher
from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.states import RUN_TRANSITIONS
from tests.procs import eventually
from tests.testapp.models import SideEffect
from tests.testapp.workflows import Counted, HangsOnce, Slow

pytestmark = pytest.mark.django_db(transaction=True)

#: Short thresholds so crashes are detected in seconds, not the production hour.
FAST = {
    "SWEEP_INTERVAL": 0.5,
    "HEARTBEAT_INTERVAL": 0.5,
    "DISPATCHER_DEAD_AFTER": 2,
    "POLL_INTERVAL": 0.2,
}


def all_finished(count):
    return lambda: WorkflowRun.objects.filter(status="finished").count() == count


def assert_valid_audit_trail(run):
    """Every transition event starts where the previous one ended and is allowed by the table."""
    status = None
    for event in WorkflowEvent.objects.filter(run=run).exclude(to_status="").order_by("pk"):
        if event.kind == "started":
            status = event.to_status
            continue
        assert event.from_status == status, f"{event.kind}: from {event.from_status}, but the run was {status}"
        assert (event.from_status, event.to_status) in RUN_TRANSITIONS[event.transition]
        status = event.to_status
    assert status == WorkflowRun.objects.get(pk=run.pk).status


@pytest.mark.processes
def test_once_drains_what_is_due_and_exits_zero(dispatchers):
    runs = [Counted.start() for _ in range(10)]
    process = dispatchers("--once", "--concurrency", "2", settings=FAST)

    assert process.wait() == 0, process.output()
    assert WorkflowRun.objects.filter(status="finished").count() == 10
    assert SideEffect.objects.count() == 30
    assert not Dispatcher.objects.exists()  # released on exit
    for wf in runs:
        assert_valid_audit_trail(wf.record)


@pytest.mark.processes
def test_two_dispatchers_finish_every_run_and_no_step_runs_twice(dispatchers):
    # Bodies of 0.1 s: one dispatcher alone would need 2 s, so the second one takes part (quick
    # steps would all be batched by whichever dispatcher claimed first).
    runs = [Slow.start(seconds=0.1) for _ in range(60)]
    first = dispatchers("--concurrency", "3", settings=FAST)
    second = dispatchers("--concurrency", "3", settings=FAST)

    eventually(all_finished(60), what="60 finished runs")

    keys = Counter(SideEffect.objects.values_list("label", "key"))
    assert len(keys) == 180 and set(keys.values()) == {1}, "a step attempt ran twice"
    claimers = set(WorkflowStep.objects.values_list("claimed_by", flat=True))
    assert len(claimers) == 2, f"both dispatchers should have worked: {claimers}"
    for wf in runs:
        assert_valid_audit_trail(wf.record)
    first.send(signal.SIGTERM)
    second.send(signal.SIGTERM)
    assert first.wait() == 0 and second.wait() == 0


@pytest.mark.processes
def test_sigterm_lets_the_running_step_finish_then_exits_zero(dispatchers):
    wf = Slow.start(seconds=1.5)
    process = dispatchers(settings=FAST)
    eventually(lambda: SideEffect.objects.filter(label="slow-start").exists(), what="the slow step to start")

    process.send(signal.SIGTERM)

    assert process.wait() == 0, process.output()
    assert SideEffect.objects.filter(label="slow-end").count() == 1
    work = WorkflowStep.objects.get(run=wf.record, step_name="work")
    assert (work.status, work.outcome) == ("completed", "success")
    # It stopped claiming: the next step is scheduled, untouched, for the next dispatcher.
    assert WorkflowStep.objects.get(run=wf.record, step_name="after").status == "scheduled"
    assert not Dispatcher.objects.exists()


@pytest.mark.processes
def test_second_signal_exits_at_once(dispatchers):
    Slow.start(seconds=30)
    process = dispatchers(settings=FAST)
    eventually(lambda: SideEffect.objects.filter(label="slow-start").exists(), what="the slow step to start")

    process.send(signal.SIGINT)
    eventually(lambda: "finishing running steps" in process.output(), what="the first signal to be logged")
    process.send(signal.SIGINT)

    assert process.wait(timeout=5) == 1
    assert "Second signal: exiting at once" in process.output()  # flushed before the hard exit
    assert WorkflowStep.objects.get(step_name="work").status == "in_progress"  # left to the sweep


@pytest.mark.processes
def test_sigkill_mid_step_leaves_it_in_progress_until_the_sweep_reattempts_it(dispatchers):
    wf = Slow.start(seconds=30)
    victim = dispatchers("--no-sweep", settings=FAST)
    eventually(lambda: SideEffect.objects.filter(label="slow-start").exists(), what="the slow step to start")

    victim.kill()
    attempt = WorkflowStep.objects.get(run=wf.record, step_name="work", attempt=1)
    assert attempt.status == "in_progress"  # nothing ran after the kill

    WorkflowRun.objects.filter(pk=wf.record.pk).update(arguments={"seconds": 0})
    dispatchers(settings=FAST)
    eventually(all_finished(1), what="the run to finish after the crash")

    attempt.refresh_from_db()
    assert (attempt.status, attempt.outcome) == ("failed", "stalled")
    assert attempt.error_class == "pgbus_workflows.exceptions.StepStalled"
    stalled = WorkflowEvent.objects.get(run=wf.record, kind="step_stalled")
    assert stalled.details["detection"] == "dead_dispatcher"
    second = WorkflowStep.objects.get(run=wf.record, step_name="work", attempt=2)
    assert (second.status, second.outcome) == ("completed", "success")
    assert_valid_audit_trail(wf.record)


@pytest.mark.processes
def test_a_step_hanging_past_its_timeout_is_stalled_by_the_sweep(dispatchers):
    wf = HangsOnce.start(seconds=3)
    dispatchers("--concurrency", "2", settings=FAST)

    eventually(all_finished(1), what="the hung step to be stalled and reattempted")

    first = WorkflowStep.objects.get(run=wf.record, attempt=1)
    assert first.outcome == "stalled"
    assert WorkflowEvent.objects.get(run=wf.record, kind="step_stalled").details["detection"] == "stall_at"
    # The hung body ends later; its outcome is discarded, not applied over the reattempt.
    eventually(
        lambda: WorkflowEvent.objects.filter(run=wf.record, kind="outcome_discarded").exists(),
        what="the late outcome to be discarded",
    )
    first.refresh_from_db()
    assert first.outcome == "stalled"


@pytest.mark.processes
def test_notify_starts_a_step_without_waiting_for_the_poll(dispatchers):
    process = dispatchers(settings={**FAST, "POLL_INTERVAL": 60})
    eventually(lambda: "started" in process.output(), what="the dispatcher to start")
    eventually(lambda: Dispatcher.objects.exists(), what="the dispatcher row")

    Counted.start()

    # With a 60 s poll, only the NOTIFY (and the chained next steps) can finish it this fast.
    eventually(all_finished(1), timeout=10, what="the run to finish through NOTIFY")


@pytest.mark.processes
def test_a_wait_ending_between_polls_is_met_by_the_due_timer(dispatchers):
    from tests.testapp.workflows import Waits

    dispatchers(settings={**FAST, "POLL_INTERVAL": 60})
    eventually(lambda: Dispatcher.objects.exists(), what="the dispatcher row")

    Waits.start()

    eventually(all_finished(1), timeout=15, what="the waited step to run")


@pytest.mark.processes
def test_a_lost_database_connection_is_survived(dispatchers):
    process = dispatchers(settings=FAST)
    eventually(lambda: Dispatcher.objects.exists(), what="the dispatcher row")
    pid = process.proc.pid
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )

    for _ in range(5):
        Counted.start()

    eventually(all_finished(5), what="runs started after the connection loss to finish")
    assert process.proc.poll() is None, f"dispatcher {pid} died:\n{process.output()}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "must be at least 1"),
        (["--concurrency", "many"], "expected a whole number"),
        (["--shutdown-timeout", "-1"], "must not be negative"),
        (["--queue", " "], "must not be empty"),
        (["--no-sweep", "--sweep-only"], "not allowed with argument"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("run_workflow_dispatcher", *args)


LOGGING_PROBE = """
import io, logging, sys
import django
django.setup()
from django.core.management import call_command
if sys.argv[1] == "project-handler":
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger().addHandler(Keep())
out = io.StringIO()
call_command("run_workflow_dispatcher", "--once", verbosity=1, stdout=out)
print("captured:", "Dispatcher" in out.getvalue() and "started" in out.getvalue())
if sys.argv[1] == "project-handler":
    print("propagated:", any("started" in m for m in records))
    print("own handler:", bool(logging.getLogger("pgbus_workflows").handlers))
"""


@pytest.mark.processes
@pytest.mark.parametrize("setup", ["no-logging", "project-handler"])
def test_the_commands_logs_go_to_the_projects_handlers_or_else_to_its_stdout(setup):
    import os
    import subprocess
    import sys

    from tests.procs import ROOT, database_url

    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", LOGGING_PROBE, setup], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    if setup == "no-logging":  # nothing would show them: the command writes them to its stdout
        assert "captured: True" in result.stdout
    else:  # the project's root handler gets them, and the command adds none of its own
        assert result.stdout.split() == ["captured:", "False", "propagated:", "True", "own", "handler:", "False"]


def test_a_freed_slot_wakes_the_loop_only_when_its_last_claim_filled_every_slot():
    loop = WorkflowDispatcher(concurrency=2)  # not run: its loop's rounds are called one by one
    Counted.start()
    loop._tick()  # two slots, one step due: all that was due is taken, and later work sends a NOTIFY
    loop._wake.wait(0)  # forget the wake-ups so far
    loop._slot_freed()
    assert not loop._wake.wait(0)

    Counted.start()
    Counted.start()
    loop._tick()  # one slot left, two due: more may be waiting, so a freed slot must claim again
    loop._slot_freed()
    assert loop._wake.wait(0)
    loop._wake.close()
    assert WorkflowStep.objects.filter(status="in_progress").count() == 2
