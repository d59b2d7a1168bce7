"""Holding a class or a queue: the claim passes over its steps until release, and nothing else changes."""

import logging

import pytest

from pgbus_workflows import hold_class, hold_queue, release_class, release_queue, sql
from pgbus_workflows.dsl.declared import NotRegistered
from pgbus_workflows.models import WorkflowHold, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.holding import active_holds
from pgbus_workflows.services.transactions import commit_once, holds_in_force
from tests.testapp.held_workflows import FreeWork, HeldSignalled, HeldWork

pytestmark = pytest.mark.django_db


def _claim(limit=10):
    return claim_due_steps(limit, queues=["held", "free"], claimed_by="test")


def test_no_step_of_a_held_class_is_claimed_while_other_classes_are_and_release_lets_them_go_in_due_order():
    held = [HeldWork.start(n=n) for n in range(3)]
    free = FreeWork.start()
    hold = hold_class(HeldWork, actor="ops", reason="mail is down")

    claimed = _claim()

    assert [s.run_id for s in claimed] == [free.record.pk]
    assert {r.status for r in WorkflowRun.objects.filter(workflow_class=HeldWork.name)} == {"ready"}  # not paused
    assert (hold.kind, hold.name, hold.held_by, hold.reason) == ("class", "held_work", "ops", "mail is down")

    released = release_class("held_work", actor="ops2", reason="back up")

    assert released.pk == hold.pk and released.released_by == "ops2" and released.release_reason == "back up"
    assert [s.run_id for s in _claim()] == [wf.record.pk for wf in held]  # due order
    assert active_holds() == []


def test_a_held_queue_passes_over_its_steps_of_every_class():
    held, free = HeldWork.start(), FreeWork.start()
    hold_queue("held", actor="ops", reason="maintenance")

    assert [s.run_id for s in _claim()] == [free.record.pk]
    assert release_queue("held") is not None
    assert [s.run_id for s in _claim()] == [held.record.pk]


def test_starts_and_signals_during_a_hold_are_kept_and_their_steps_come_due_unclaimed():
    waiting = HeldSignalled.start()
    hold_class(HeldSignalled, reason="downstream down")
    started = HeldSignalled.start()
    waiting.signal("go", {"ok": True})

    assert _claim() == []
    assert waiting.signals.filter(name="go").exists()
    due = WorkflowStep.objects.filter(run__workflow_class=HeldSignalled.name, status="scheduled")
    assert {s.run_id for s in due} == {waiting.record.pk, started.record.pk}  # the wait ended: due, not claimed

    release_class(HeldSignalled)
    assert {s.run_id for s in _claim()} == {waiting.record.pk, started.record.pk}


def test_a_step_claimed_before_the_hold_runs_to_its_end_and_the_next_is_not_claimed():
    wf = HeldWork.start()
    (step,) = _claim()
    hold_class(HeldWork, reason="stop")  # stops new claims, not a running body

    execute_step(step)

    assert WorkflowStep.objects.get(pk=step.pk).status == "completed"
    assert WorkflowRun.objects.get(pk=wf.record.pk).current_step == "second"
    assert _claim() == []


def test_holding_twice_keeps_the_first_hold_and_releasing_what_is_not_held_returns_none():
    first = hold_class(HeldWork, actor="a", reason="one")
    again = hold_class("held_work", actor="b", reason="two")

    assert again.pk == first.pk and again.held_by == "a" and again.reason == "one"
    assert WorkflowHold.objects.count() == 1
    assert release_class(FreeWork) is None
    assert release_queue("nowhere") is None
    release_class(HeldWork)
    assert hold_class(HeldWork).pk != first.pk  # a new hold, the old one kept as history
    assert WorkflowHold.objects.count() == 2


def test_an_unknown_class_or_a_bad_queue_name_is_refused_with_the_names_it_may_be():
    with pytest.raises(NotRegistered, match=r"No workflow class is registered as 'nope' \(registered: .*held_work"):
        hold_class("nope")
    with pytest.raises(NotRegistered, match="No workflow class is registered as"):
        release_class(object)
    for bad in ["", "   ", "q" * 201, None]:
        with pytest.raises(ValueError, match="A queue name is a non-empty string of at most 200 characters"):
            hold_queue(bad)
    assert not WorkflowHold.objects.exists()


def test_hold_and_release_are_logged_with_actor_and_reason(caplog):
    with caplog.at_level(logging.WARNING, logger="pgbus_workflows"):
        hold_queue("held", actor="ops", reason="db failover")
        release_queue("held")
    assert "Workflow queue 'held' held by ops: db failover" in caplog.text
    assert "Workflow queue 'held' released by api: (no reason given)" in caplog.text


def test_a_hold_parks_its_steps_out_of_the_claims_range_the_sweep_parks_later_ones_and_release_puts_them_back():
    from pgbus_workflows.services.holding import park_held_steps
    from pgbus_workflows.services.limiting import held_back_counts
    from pgbus_workflows.sql import clock

    early = [HeldWork.start() for _ in range(3)]
    hold_class(HeldWork, reason="down")
    scheduled = WorkflowStep.objects.filter(run__workflow_class=HeldWork.name, status="scheduled")
    assert set(scheduled.values_list("parked", "parked_on")) == {(True, "hold:class:held_work")}
    late = HeldWork.start()  # scheduled during the hold: not parked until the sweep's pass
    assert not scheduled.get(run_id=late.record.pk).parked
    assert park_held_steps() == 1
    assert scheduled.filter(parked=False).count() == 0
    assert held_back_counts(clock.now()) == {}  # a hold is not a limit
    FreeWork.start()
    assert [s.step_name for s in _claim()] == ["only"]  # a claim's unpark leaves a hold's steps parked

    release_class(HeldWork)

    assert scheduled.filter(parked=True).count() == 0
    assert {s.run_id for s in _claim()} == {wf.record.pk for wf in [*early, late]}


def test_a_queue_hold_parks_the_steps_on_its_queue_and_with_nothing_held_the_sweep_parks_nothing():
    from pgbus_workflows.services.holding import park_held_steps

    wf = HeldWork.start()
    assert park_held_steps() == 0
    hold_queue("held", reason="down")
    assert WorkflowStep.objects.get(run_id=wf.record.pk).parked_on == "hold:queue:held"
    release_queue("held")
    assert not WorkflowStep.objects.get(run_id=wf.record.pk).parked


@pytest.mark.django_db(transaction=True)
def test_an_outcome_batch_reads_the_holds_with_its_transactions_id_names_with_colons_kept():
    hold_class(HeldWork, reason="down")
    hold_queue("region:eu", reason="maintenance")

    def read() -> frozenset[tuple[str, str]]:
        with sql.pipeline() as cursor:  # the work's first pipeline takes the question of the id
            cursor.execute("SELECT 1")
        return holds_in_force()

    assert commit_once(read) == {("class", "held_work"), ("queue", "region:eu")}
    release_queue("region:eu")
    assert commit_once(read) == {("class", "held_work")}
    assert holds_in_force() == {("class", "held_work")}  # outside commit_once: one read of its own
