"""Faults from inside the process, on real PostgreSQL: every one ends in exactly one recorded outcome.

A body that raises a BaseException, an outcome the database refuses, a user callable that
raises while the outcome is written, an atomic body that swallows a database error or runs
past its timeout, a sweep row that fails, a run locked while the sweep passes, a COMMIT whose
answer is lost or that fails, and a worker thread that dies anyway. (The faults that live in
the dispatcher process are in ``test_fault_processes.py``.)
"""

import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings

from pgbus_workflows.dispatcher import sweep
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.dispatcher.workers import WorkerPool
from pgbus_workflows.exceptions import PayloadNotSerializable
from pgbus_workflows.models import Dispatcher, FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from pgbus_workflows.services.applying import apply_outcomes
from pgbus_workflows.services.chain import Chain
from pgbus_workflows.services.claims import claim_due_steps, claim_step, stall
from pgbus_workflows.services.executor import execute_step, perform_step
from pgbus_workflows.services.fanout import claim_due_jobs, execute_job, record_job_ends, run_job
from pgbus_workflows.services.locks import RunLocked
from pgbus_workflows.services.payload import storable_text
from pgbus_workflows.services.retention import delete_expired_runs
from pgbus_workflows.sql import clock
from tests.faultproxy import CommitAnswerLost
from tests.procs import eventually
from tests.testapp import fault_workflows as faults
from tests.testapp.models import Receipt, SideEffect
from tests.testapp.workflows import Counted, NoOp3, Squares
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def run_first_step(wf):
    """Claim the run's scheduled step and run it as a dispatcher would; returns the attempt row."""
    step = WorkflowStep.objects.get(run=wf.record, status="scheduled")
    execute_step(claim_step(step.pk, "test"))
    return WorkflowStep.objects.get(pk=step.pk)


def ran(label):
    return SideEffect.objects.filter(label=label).count()


@contextmanager
def run_locked_elsewhere(run_pk):
    """Another connection holds the run's row lock (as an atomic body or an operator would) for the block."""
    holding, release = threading.Event(), threading.Event()

    def hold_the_lock():
        with transaction.atomic():
            WorkflowRun.objects.select_for_update().get(pk=run_pk)
            holding.set()
            release.wait(30)

    holder = Worker(hold_the_lock)
    holder.start()
    assert holding.wait(10)
    try:
        yield holder
    finally:
        release.set()
        holder.finish()


# -- a body that raises a BaseException ------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(faults.BASE_EXCEPTIONS))
def test_a_body_raising_a_base_exception_ends_in_one_recorded_error(kind):
    wf = faults.RaisesBaseException.start(kind=kind)

    attempt = run_first_step(wf)

    assert attempt.status == "failed" and attempt.outcome == "failed"
    assert attempt.error_class.rsplit(".", 1)[-1] == kind
    assert kind in attempt.traceback
    assert wf.reload().status == "paused"  # the default policy
    assert ran("base-exception") == 1 and ran("base-exception-after") == 0


def test_a_job_raising_system_exit_fails_that_job_only():
    wf = faults.JobRaisesSystemExit.start()
    run_first_step(wf)

    for job in claim_due_jobs(10, claimed_by="test"):
        execute_job(job)

    jobs = FanOutJob.objects.filter(run=wf.record)
    assert {job.status for job in jobs} == {"failed"}
    assert all("SystemExit" in job.error for job in jobs)
    assert ran("exiting-job") == 2
    assert wf.reload().status == "finished"  # on_job_failure="continue"


# -- outcomes the database cannot store, and user callables that raise while writing ------------


def test_an_output_with_a_nul_character_is_the_attempts_error_and_the_body_runs_once():
    wf = faults.NulOutput.start()

    attempt = run_first_step(wf)

    assert attempt.error_class == "pgbus_workflows.exceptions.PayloadNotSerializable"
    assert "NUL character" in attempt.error_message
    assert wf.reload().status == "paused"
    assert ran("nul-output") == 1


def test_an_error_message_with_a_nul_character_is_kept_readable():
    wf = faults.NulError.start()

    attempt = run_first_step(wf)

    assert attempt.error_class == "ValueError"
    assert attempt.error_message == "bad\ufffdbyte"
    assert "bad\ufffdbyte" in wf.reload().record.paused_reason
    assert ran("nul-error") == 1


@pytest.mark.parametrize(
    ("workflow", "label", "error_class"),
    [
        (faults.BrokenWait, "broken-wait-first", "ZeroDivisionError"),
        (faults.HugeReattemptWait, "huge-wait", "OverflowError"),
    ],
)
def test_an_outcome_that_cannot_be_written_becomes_a_failed_attempt_not_a_second_run(workflow, label, error_class):
    wf = workflow.start()

    attempt = run_first_step(wf)

    assert attempt.status == "failed"
    assert attempt.error_class == error_class
    assert wf.reload().status == "paused"
    failed = WorkflowEvent.objects.get(run=wf.record, kind="step_failed")
    assert failed.details["unwritable_outcome"] in ("success", "reattempt")
    assert ran(label) == 1
    assert WorkflowStep.objects.filter(run=wf.record).count() == 1  # nothing left to run it again


def test_one_unwritable_outcome_in_a_batch_costs_only_its_own_run():
    good = [NoOp3.start() for _ in range(3)]
    bad = faults.BrokenWait.start()
    chain = Chain("w")
    performed = [perform_step(step, chain=chain) for step in claim_due_steps(10, claimed_by="w")]

    results = apply_outcomes(performed, chain)

    assert sorted(r.kind for r in results) == ["error", "success", "success", "success"]
    assert bad.reload().status == "paused"
    for wf in good:
        assert WorkflowStep.objects.get(run=wf.record, step_name="a").status == "completed"
    assert len(chain.take()) == 3  # the good runs' next steps, claimed for this worker


def test_a_nul_job_result_fails_that_job_and_keeps_the_other_five():
    wf = faults.NulJobResult.start()
    run_first_step(wf)
    jobs = claim_due_jobs(10, claimed_by="test")

    statuses = record_job_ends([run_job(job) for job in jobs])

    assert sorted(statuses) == ["failed"] + ["succeeded"] * 5
    bad = FanOutJob.objects.get(run=wf.record, index=3)
    assert "NUL character" in bad.error
    assert sorted(j.result for j in FanOutJob.objects.filter(run=wf.record, status="succeeded")) == [
        "0",
        "1",
        "2",
        "4",
        "5",
    ]
    assert ran("nul-job") == 6


def test_a_backoff_that_raises_fails_the_job_with_both_errors():
    wf = faults.BrokenBackoff.start()
    run_first_step(wf)

    execute_job(claim_due_jobs(1, claimed_by="test")[0])

    job = FanOutJob.objects.get(run=wf.record)
    assert job.status == "failed" and job.attempts == 1
    assert "job 0 fails" in job.error and "the backoff cannot be computed" in job.error
    assert wf.reload().status == "paused"  # FanOutFailed, then the default policy


def test_storable_text_replaces_what_a_text_column_refuses():
    assert storable_text("a\x00b\ud800c") == "a\ufffdb\ufffdc"
    assert storable_text("plain") == "plain"


# -- atomic bodies -----------------------------------------------------------------------------


def test_an_atomic_body_that_swallows_a_database_error_is_rolled_back_and_fails_once():
    wf = faults.SwallowsDatabaseError.start()

    attempt = run_first_step(wf)

    assert attempt.status == "failed"
    assert "aborted" in attempt.error_message or "division by zero" in attempt.error_message
    assert not Receipt.objects.exists()  # the body's write rolled back with it
    assert wf.reload().status == "paused"
    assert WorkflowStep.objects.filter(run=wf.record).count() == 1


@override_settings(PGBUS_WORKFLOWS={"STALL_ACTION": "reattempt"})
def test_a_hung_atomic_body_is_cut_off_by_the_database_at_its_timeout_and_stalls():
    wf = faults.HungAtomic.start(seconds=4)
    step = claim_step(WorkflowStep.objects.get(run=wf.record).pk, "test")
    body = Worker(execute_step, step)
    body.start()
    eventually(
        lambda: WorkflowRun.objects.filter(pk=wf.record.pk, status="performing").exists(), what="the body to begin"
    )

    def run_lock_free():
        try:
            with transaction.atomic():
                return WorkflowRun.objects.select_for_update(nowait=True).get(pk=wf.record.pk)
        except OperationalError:  # still held: the body's session lives on
            return None

    # Past the 1 s timeout the database ends the body's session: its run lock is free although
    # the body (4 s) runs on.
    locked = eventually(run_lock_free, timeout=20, interval=0.1, what="the database to end the body's session")
    assert body.is_alive() and locked.status == "performing"
    body.finish()

    first = WorkflowStep.objects.get(run=wf.record, step_name="hang", attempt=1)
    assert first.outcome == "stalled" and "timeout" in first.error_message
    assert not Receipt.objects.exists()  # its write was rolled back
    second = WorkflowStep.objects.get(run=wf.record, step_name="hang", attempt=2)
    assert second.status == "scheduled"
    execute_step(claim_step(second.pk, "test"))
    assert list(Receipt.objects.values_list("note", flat=True)) == ["hung 2"]


def test_an_atomic_query_past_the_timeout_is_cancelled_and_the_attempt_stalls():
    wf = faults.SlowAtomicQuery.start()

    attempt = run_first_step(wf)

    assert attempt.outcome == "stalled" and "timeout" in attempt.error_message
    assert not Receipt.objects.exists()
    assert WorkflowStep.objects.get(run=wf.record, attempt=2).status == "scheduled"


def test_a_heartbeat_inside_an_atomic_body_writes_nothing():
    wf = faults.AtomicHeartbeat.start()

    attempt = run_first_step(wf)

    assert attempt.status == "completed" and attempt.output == {"alive": True}
    assert not WorkflowEvent.objects.filter(run=wf.record, kind="step_stalled").exists()


REFUSE_COMMIT = """
CREATE OR REPLACE FUNCTION testapp_refuse_commit() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'refused at commit'; END $$ LANGUAGE plpgsql;
CREATE CONSTRAINT TRIGGER testapp_refuse_commit AFTER UPDATE ON {table}
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
WHEN (NEW.step_name = 'commit_fails' AND NEW.status = 'completed') EXECUTE FUNCTION testapp_refuse_commit();
"""


@pytest.fixture
def commit_refused():
    table = WorkflowStep._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_COMMIT.format(table=table))
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER testapp_refuse_commit ON {table}; DROP FUNCTION testapp_refuse_commit()")


def test_an_atomic_step_whose_commit_fails_records_the_error_and_chains_no_phantom_step(commit_refused):
    wf = faults.CommitFails.start()
    step = claim_step(WorkflowStep.objects.get(run=wf.record).pk, "test")
    chain = Chain("test")

    done = perform_step(step, chain=chain)

    assert done is not None and done.kind == "error"
    assert chain.take() == []  # the next step of the transaction that failed is not run
    attempt = WorkflowStep.objects.get(pk=step.pk)
    assert attempt.status == "failed" and "refused at commit" in attempt.error_message
    assert wf.reload().status == "paused"
    assert not Receipt.objects.exists()
    assert ran("commit-fails-next") == 0
    assert not WorkflowStep.objects.filter(run=wf.record, step_name="next_one").exists()


# -- COMMITs whose answer is lost ----------------------------------------------------------------


@pytest.fixture
def proxy():
    """Route this thread's connection through a proxy that can lose a COMMIT's answer."""
    settings_dict = connection.settings_dict
    saved = {key: settings_dict[key] for key in ("HOST", "PORT", "OPTIONS")}
    proxy = CommitAnswerLost((settings_dict["HOST"] or "127.0.0.1", int(settings_dict["PORT"] or 5432)))
    connection.close()
    settings_dict.update(HOST="127.0.0.1", PORT=str(proxy.port), OPTIONS={**saved["OPTIONS"], "sslmode": "disable"})
    yield proxy
    connection.close()
    settings_dict.update(saved)
    proxy.close()


def test_a_batch_whose_commit_answer_was_lost_is_not_applied_again_and_its_chained_steps_run(proxy):
    runs = [NoOp3.start() for _ in range(3)]
    chain = Chain("w")
    performed = [perform_step(step, chain=chain) for step in claim_due_steps(10, claimed_by="w")]

    proxy.armed.set()
    results = apply_outcomes(performed, chain)

    assert proxy.dropped.is_set(), "the proxy never saw the COMMIT"
    assert [r.kind for r in results] == ["success"] * 3
    chained = chain.take()
    assert sorted(s.run_id for s in chained) == sorted(wf.record.pk for wf in runs)
    assert all(WorkflowStep.objects.get(pk=s.pk).status == "in_progress" for s in chained)
    assert not WorkflowEvent.objects.filter(kind="outcome_discarded").exists()
    completions = Counter(WorkflowEvent.objects.filter(kind="step_completed").values_list("run_id", flat=True))
    assert sorted(completions.values()) == [1, 1, 1]


def test_job_ends_whose_commit_answer_was_lost_resolve_the_fan_out_once(proxy):
    wf = Squares.start(count=3)
    run_first_step(wf)
    jobs = claim_due_jobs(10, claimed_by="w")
    ends = [run_job(job) for job in jobs]

    proxy.armed.set()
    statuses = record_job_ends(ends, Chain("w"))

    assert proxy.dropped.is_set()
    assert statuses == ["succeeded"] * 3
    fan_out = WorkflowStep.objects.get(run=wf.record, fan_out_total__isnull=False)
    assert fan_out.status == "completed"  # resolved at once, not by the sweep an hour later


def test_an_atomic_step_whose_commit_answer_was_lost_keeps_its_chained_step(proxy):
    wf = faults.HoldsLock.start(seconds=0)
    step = claim_step(WorkflowStep.objects.get(run=wf.record).pk, "test")

    proxy.armed.set()
    outcome = perform_step(step, chain=Chain("test"))

    assert proxy.dropped.is_set()
    assert outcome is not None and outcome.kind == "success"
    assert Receipt.objects.count() == 1
    assert WorkflowStep.objects.get(pk=step.pk).status == "completed"
    assert wf.reload().status == "finished"


# -- the sweep --------------------------------------------------------------------------------


def test_the_sweep_passes_over_a_locked_run_and_serves_the_others():
    stuck = Counted.start()
    stuck_step = claim_step(WorkflowStep.objects.get(run=stuck.record).pk, "gone")
    WorkflowStep.objects.filter(pk=stuck_step.pk).update(stall_at=clock.now() - timedelta(seconds=1))
    waiting = faults.TimesOut.start()
    run_first_step(waiting)

    with run_locked_elsewhere(stuck.record.pk) as holder:
        summary = Sweeper().run(now=clock.now() + timedelta(seconds=2))
        assert holder.is_alive(), "the sweep waited for the lock"

    assert summary["stalled"] == 0 and summary["wait_timeouts"] == 1
    assert WorkflowStep.objects.get(pk=stuck_step.pk).status == "in_progress"
    assert Sweeper().run(now=clock.now() + timedelta(seconds=2))["stalled"] == 1


def test_stall_with_skip_locked_refuses_to_wait():
    wf = Counted.start()
    step = claim_step(WorkflowStep.objects.get(run=wf.record).pk, "gone")
    with run_locked_elsewhere(wf.record.pk), pytest.raises(RunLocked):
        stall(step.pk, wf.record.pk, detection="dead_dispatcher", skip_locked=True)
    assert stall(step.pk, wf.record.pk, detection="dead_dispatcher", skip_locked=True)


def test_one_bad_row_costs_only_itself_and_is_recorded_on_its_run(caplog):
    bad = faults.TimesOutIntoBrokenWait.start()  # the first in timeout order
    good = [faults.TimesOut.start() for _ in range(3)]
    for wf in [bad, *good]:
        run_first_step(wf)
    sweeper = Sweeper()
    later = clock.now() + timedelta(seconds=2)

    with caplog.at_level(logging.ERROR, logger="pgbus_workflows"):
        summary = sweeper.run(now=later)

    assert summary["wait_timeouts"] == 3
    for wf in good:
        assert WorkflowStep.objects.get(run=wf.record, step_name="after").status == "scheduled"
    assert bad.reload().status == "waiting"
    failure = WorkflowEvent.objects.get(run=bad.record, kind="sweep_failed")
    assert failure.details["phase"] == "wait_timeouts"
    assert "ZeroDivisionError" in failure.reason
    assert "passing it over" in caplog.text

    assert sweeper.run(now=later)["wait_timeouts"] == 0  # passed over, not met first again
    assert WorkflowEvent.objects.filter(run=bad.record, kind="sweep_failed").count() == 1


def expired_runs(count):
    old = clock.now() - timedelta(days=60)
    WorkflowRun.objects.bulk_create(
        WorkflowRun(workflow_class="counted", status="finished", status_changed_at=old, finished_at=old)
        for _ in range(count)
    )


def test_retention_is_bounded_per_sweep_and_works_off_a_backlog_over_the_next_sweeps(monkeypatch):
    monkeypatch.setattr(sweep, "CLEANUP_SECONDS", 0)  # one batch of 500, however fast
    expired_runs(1_200)
    sweeper = Sweeper()

    assert sweeper.run()["cleanup"] == 500
    assert sweeper.cleanup_backlog
    assert sweeper.run()["cleanup"] == 500  # the next sweep, not an hour later
    assert sweeper.cleanup_backlog
    assert sweeper.run()["cleanup"] == 200
    assert not sweeper.cleanup_backlog
    assert "cleanup" not in sweeper.run()  # then hourly again
    assert not WorkflowRun.objects.exists()


def test_retention_skips_a_run_another_transaction_holds():
    expired_runs(3)
    first = WorkflowRun.objects.order_by("pk").first()
    with run_locked_elsewhere(first.pk):
        assert delete_expired_runs(clock.now()) == 2
    assert list(WorkflowRun.objects.values_list("pk", flat=True)) == [first.pk]


# -- a worker thread that dies anyway --------------------------------------------------------


def test_a_worker_thread_that_dies_is_replaced_and_the_outcomes_it_ran_are_written(monkeypatch, caplog):
    runs = [Counted.start() for _ in range(3)]
    real_write = WorkerPool._write_batch
    broken = threading.Event()

    def write_or_die(self, lane, chain):
        if not broken.is_set():
            broken.set()
            raise SystemExit("a bug in the worker loop")
        real_write(self, lane, chain)

    monkeypatch.setattr(WorkerPool, "_write_batch", write_or_die)
    stopping, lost = threading.Event(), threading.Event()
    pool = WorkerPool(name="w", queues=None, size=1, stopping=stopping, on_free=lambda: None, on_lost=lost.set)
    pool.hand_out(claim_due_steps(10, claimed_by="w"), verify=True)

    with caplog.at_level(logging.CRITICAL, logger="pgbus_workflows"):
        pool.start()
        eventually(
            lambda: WorkflowRun.objects.filter(status="finished").count() == 3,
            what="the runs to finish after the worker died",
        )

    assert broken.is_set() and pool.replaced == 1 and pool.alive() == 1
    assert "Worker thread 0 died" in caplog.text
    assert Counter(SideEffect.objects.values_list("label", "key")).most_common(1)[0][1] == 1, "a body ran twice"
    assert not lost.is_set()
    stopping.set()
    assert not pool.join(time.monotonic() + 30)
    assert all(wf.reload().status == "finished" for wf in runs)


# -- the edges refuse what PostgreSQL cannot store -------------------------------------------


@pytest.mark.parametrize("text", ["nul\x00inside", "lone \ud800 surrogate"])
def test_arguments_and_signal_payloads_that_postgresql_cannot_store_are_refused_before_any_write(text):
    with pytest.raises(PayloadNotSerializable):
        NoOp3.start(note=text)
    assert not WorkflowRun.objects.exists()

    wf = NoOp3.start()
    with pytest.raises(PayloadNotSerializable):
        wf.signal("go", {"note": text})
    assert not WorkflowSignal.objects.exists()


def test_text_that_only_looks_like_a_nul_escape_is_kept():
    wf = NoOp3.start(note="\\u0000 is six characters")
    assert wf.reload().record.arguments == {"note": "\\u0000 is six characters"}


@override_settings(PGBUS_WORKFLOWS={"STALL_ACTION": "reattempt"})
def test_a_body_whose_database_connection_is_lost_stalls_instead_of_going_to_its_policy():
    wf = faults.LosesConnection.start()

    first = run_first_step(wf)

    assert first.outcome == "stalled"
    stalled = WorkflowEvent.objects.get(run=wf.record, kind="step_stalled")
    assert stalled.details["detection"] == "connection_lost"
    assert "OperationalError" in stalled.details["cause"]
    run_first_step(wf)
    assert wf.reload().status == "finished"
    assert ran("loses-connection") == 2


def test_the_new_counters_have_database_defaults_for_code_deployed_before_them():
    """A dispatcher of the previous release inserts rows without these columns (a rolling deploy)."""
    wf = Squares.start(count=1)
    run_first_step(wf)
    job = FanOutJob.objects.get(run=wf.record)
    columns = [f.column for f in FanOutJob._meta.concrete_fields if f.name not in ("id", "stalls")]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {FanOutJob._meta.db_table} ({', '.join(columns)}) "
            f"SELECT {', '.join(c if c != 'index' else 'index + 1' for c in columns)} "
            f"FROM {FanOutJob._meta.db_table} WHERE id = %s RETURNING stalls",
            [job.pk],
        )
        assert cursor.fetchone() == (0,)
        cursor.execute(
            f"INSERT INTO {Dispatcher._meta.db_table} (name, hostname, pid, queues, concurrency, started_at, "
            "heartbeat_at) VALUES ('old', 'h', 1, '[]', 1, now(), now()) RETURNING workers_alive"
        )
        assert cursor.fetchone() == (0,)
