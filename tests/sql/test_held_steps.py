"""A paused run's scheduled attempt is held: out of every claim's range until the run resumes.

The due index is (priority, ``held``, ``scheduled_at``, id): a claim reads each priority's
range of attempts that are not held, so the due steps of paused runs (an operator's pause
during an incident, the sweep's pause of steps no live code defines) no longer cost every
claim a read of each one and its run (docs/dispatcher.md). The flag is written
under the run's lock by every unit of work that begins or ends with the run paused
(``RunLedger.flush``); the state machine test checks it after every verb.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from pgbus_workflows import InvalidTransition
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.applying import apply_outcomes
from pgbus_workflows.services.claims import claim_and_look_ahead, claim_due_steps, claim_step
from pgbus_workflows.services.executor import execute_step, perform_step, run_due_steps
from pgbus_workflows.sql import clock
from pgbus_workflows.sql.statements import INDEX_PLANS
from pgbus_workflows.states import ACTIVE_STEP
from tests.sql.test_claim_ranges import MORE_PAGES, pages_read, vacuum
from tests.sql.test_query_plans import LIVE_STEPS, nodes
from tests.testapp.workflows import Approval, NoOp3
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def held(wf) -> list[str]:
    """The names of ``wf``'s held attempts."""
    return list(WorkflowStep.objects.filter(run_id=wf.record.pk, held=True).values_list("step_name", flat=True))


def claimed_names(limit: int = 10) -> list[str]:
    return [step.step_name for step in claim_due_steps(limit, claimed_by="d")]


def test_a_pause_holds_the_scheduled_attempt_and_resume_releases_it():
    wf = NoOp3.start()

    wf.pause("incident")
    assert held(wf) == ["a"]
    assert claimed_names() == []

    wf.resume()
    assert held(wf) == []
    assert claimed_names() == ["a"]


@pytest.mark.parametrize("path", ["alone", "batched"])
def test_a_step_that_ends_while_its_run_is_paused_schedules_the_next_attempt_held(path):
    wf = NoOp3.start()
    step = claim_step(WorkflowStep.objects.get(run=wf.record).pk, claimed_by="d")
    wf.pause("during the step")  # performing -> paused; the attempt runs on

    if path == "alone":
        execute_step(step)
    else:  # as the dispatcher's workers write outcomes: several runs' in one transaction
        other = NoOp3.start()
        second = claim_step(WorkflowStep.objects.get(run=other.record).pk, claimed_by="d")
        apply_outcomes([perform_step(step), perform_step(second)])
        assert held(other) == []

    assert (wf.reload().status, held(wf)) == ("paused", ["b"])
    assert wf.record.pk not in [s.run_id for s in claim_due_steps(10, claimed_by="d")]
    wf.resume()
    assert held(wf) == []
    assert [(s.run_id, s.step_name) for s in claim_due_steps(10, claimed_by="d")] == [(wf.record.pk, "b")]


def test_a_signal_to_a_paused_waiting_run_schedules_its_step_held():
    wf = Approval.start()
    run_due_steps(claimed_by="d")  # parks in "approve"
    wf.pause("wait")

    wf.signal("approved", {"ok": True})
    active = WorkflowStep.objects.get(run_id=wf.record.pk, status__in=ACTIVE_STEP)
    assert (active.step_name, active.status, active.held) == ("approve", "scheduled", True)
    assert claimed_names() == []

    wf.resume()
    assert claimed_names() == ["approve"]


@pytest.mark.parametrize(
    "verb, status, names",
    [
        (lambda wf: wf.cancel("no"), "cancelled", []),
        (lambda wf: wf.skip("not this one"), "ready", ["b"]),
        (lambda wf: wf.resume_at("c"), "ready", ["c"]),
    ],
    ids=["cancel", "skip", "resume_at"],
)
def test_every_verb_that_ends_a_pause_releases_the_hold(verb, status, names):
    wf = NoOp3.start()
    wf.pause("look")
    assert held(wf) == ["a"]

    verb(wf)

    assert wf.reload().status == status
    assert not WorkflowStep.objects.filter(held=True).exists()
    assert claimed_names() == names


def test_a_claim_reads_no_more_behind_twenty_thousand_paused_runs_whose_steps_are_due():
    def claim():
        return claim_and_look_ahead(1, claimed_by="d")

    first = NoOp3.start()
    alone = pages_read(claim, "AS step_key")
    sample = NoOp3.start()
    sample.pause("incident")
    assert held(sample) == ["a"]
    NoOp3.start_many([{} for _ in range(20_000)])
    # Paused as the verb left ``sample``: a pause of each, one by one, would take the test
    # longer than what it checks.
    WorkflowRun.objects.filter(status="ready").exclude(pk=first.record.pk).update(
        status="paused", paused_reason="incident"
    )
    # Due an hour ago: ahead of ``first``'s step in the due order, where a claim meets them first.
    WorkflowStep.objects.filter(run__status="paused").update(held=True, scheduled_at=clock.now() - timedelta(hours=1))
    vacuum(WorkflowStep)
    behind_them = pages_read(claim, "AS step_key")
    # 40 against 60 here: the claim's own writes reach indexes grown a level deeper. Before
    # ``held``, the claim read each paused run's step and its run first: 107,744 pages.
    assert behind_them - alone <= 3 * MORE_PAGES, (alone, behind_them)
    (claimed,) = claim()[0]
    assert claimed.run_id == first.record.pk
    steps, ahead = claim()
    assert steps == [] and ahead.next_due_at is None


def test_the_sweep_releases_a_hold_that_code_older_than_the_flag_left_on_a_resumed_run():
    wf, other = NoOp3.start(), NoOp3.start()
    wf.pause("deploy")
    other.pause("still looking")
    # Code from before the flag resumes ``wf``: the run is ready, its attempt left held.
    WorkflowRun.objects.filter(pk=wf.record.pk).update(status="ready", paused_reason="")
    assert claimed_names() == []

    summary = Sweeper().run(clock.now())

    assert summary["stray_holds"] == 1
    assert held(wf) == [] and held(other) == ["a"]  # a paused run keeps its hold
    event = WorkflowEvent.objects.get(run_id=wf.record.pk, kind="hold_released")
    assert (event.actor, event.step.step_name) == ("system", "a")
    assert claimed_names() == ["a"]
    assert Sweeper().run(clock.now())["stray_holds"] == 0


@pytest.mark.parametrize("held_and_parked", ["", "AND NOT s.held AND NOT s.parked "])
def test_a_claim_of_code_older_than_the_due_index_still_reads_only_the_live_steps(held_and_parked):
    # A rolling deploy: a dispatcher still on the code before 0011 reads each priority's due
    # range without ``held``; one on the code before 0027, by ``scheduled_at`` itself. No index
    # gives that order any more: a partial index of the steps not finished serves it (the due
    # index by its priority, or the index of active steps), sorted, never the steps table.
    # Due a minute ago: the steps were scheduled by the engine's clock, which may read a few ms
    # ahead of the server's now() the older statement compares with (half a round trip's error).
    NoOp3.start_many([{} for _ in range(50)])
    WorkflowStep.objects.update(scheduled_at=F("scheduled_at") - timedelta(minutes=1))
    older = (
        "SELECT s.id FROM pgbus_workflows_workflowstep s WHERE s.priority = 0 AND s.status = 'scheduled' "
        f"{held_and_parked}AND s.scheduled_at <= now() ORDER BY s.scheduled_at, s.id LIMIT 5 "
        "FOR UPDATE OF s SKIP LOCKED"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT {INDEX_PLANS}")
        cursor.execute("EXPLAIN (FORMAT JSON) " + older)
        plan = cursor.fetchone()[0][0]["Plan"]
        cursor.execute(older)
        assert len(cursor.fetchall()) == 5
    scans = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan) if n.get("Relation Name")]
    assert scans and all(kind == "Index Scan" and index in LIVE_STEPS for kind, index in scans), scans


def race_pauses_against_a_draining_worker(count: int) -> None:
    """``count`` runs paused and resumed four times over while a worker drains them; every one ends finished."""
    runs = [NoOp3.start() for _ in range(count)]
    stop = threading.Event()

    def drain():
        ran = 0
        while not stop.is_set():
            ran += run_due_steps(claimed_by="racer", limit=5)
        return ran

    worker = Worker(drain)
    worker.start()
    deadline = timezone.now() + timedelta(seconds=20)
    try:
        for _ in range(4):
            for wf in runs:
                try:
                    wf.pause("race")
                except InvalidTransition:
                    assert wf.reload().status == "finished"  # it finished first
            for wf in runs:
                if wf.reload().status == "paused":
                    assert held(wf) in ([], [wf.record.current_step]), held(wf)  # held once its step ended
                    wf.resume()
        while WorkflowRun.objects.filter(pk__in=[wf.record.pk for wf in runs]).exclude(status="finished").exists():
            if timezone.now() > deadline:
                break
            stop.wait(0.05)
    finally:
        stop.set()
    assert worker.finish() >= 3 * count
    assert WorkflowRun.objects.filter(pk__in=[wf.record.pk for wf in runs], status="finished").count() == count
    assert not WorkflowStep.objects.filter(held=True).exists()


def test_pauses_and_resumes_racing_a_draining_worker_leave_every_run_finished_and_nothing_held():
    # The race must be run: steps ending while their runs are paused (10 to 19 of about 55 pauses
    # on a quiet machine). A loaded one may schedule the worker so that none does in one batch:
    # another batch then, a few at most.
    for _ in range(5):
        race_pauses_against_a_draining_worker(30)
        if WorkflowEvent.objects.filter(transition="hold").exists():
            break
    assert WorkflowEvent.objects.filter(transition="hold").exists()
