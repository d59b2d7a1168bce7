"""Fairness: claims take the due steps of several keys in turn (weighted), across dispatchers, with no per-key scan."""

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection

from pgbus_workflows import Concurrency, Fairness, Workflow, hold_class, release_class, step
from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.dsl.deploy import any_fairness, catalog_json
from pgbus_workflows.dsl.fairness import FAIR_QUANTUM
from pgbus_workflows.exceptions import ConfigurationError
from pgbus_workflows.models import FanOutJob, WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.services.start import start_run
from pgbus_workflows.sql import clock
from pgbus_workflows.sql.claiming import claim_steps
from pgbus_workflows.sql.statements import columns
from tests.sql.test_claim_ranges import MORE_PAGES, pages_read, settle
from tests.support import changed_classes, scheduled
from tests.testapp.fair_workflows import TENANT_FAIRNESS, Tenanted

TENANTS = ["tenants"]


@pytest.fixture
def fair(change_classes):
    """``Tenanted`` with its fairness declared (the catalog then has a class with fairness)."""
    change_classes(Tenanted, "fairness", TENANT_FAIRNESS)


def _claim(limit: int) -> list[WorkflowStep]:
    return claim_due_steps(limit, queues=TENANTS, claimed_by="test")


def _tenants(steps: list[WorkflowStep]) -> list[str]:
    return [step.run.arguments["tenant"] for step in steps]


def _start(tenant: str, count: int) -> list[Tenanted]:
    return [Tenanted.start(tenant=tenant) for _ in range(count)]


@pytest.mark.django_db
def test_a_tenant_with_few_runs_is_claimed_among_the_first_behind_a_tenant_with_many(fair):
    _start("a", 30)
    _start("b", 3)  # started after every run of a

    claimed = _claim(6)

    assert sorted(_tenants(claimed)) == ["a", "a", "a", "b", "b", "b"]  # in turn: b's three among the first six
    assert _tenants(claimed)[:2] in (["a", "b"], ["b", "a"])


@pytest.mark.django_db
def test_within_a_key_steps_are_claimed_in_due_order(fair):
    runs = _start("a", 5)

    claimed = _claim(5)

    assert [step.run_id for step in claimed] == [wf.record.pk for wf in runs]


@pytest.mark.django_db
def test_weights_are_respected(fair):
    Tenanted.start_many([{"arguments": {"tenant": "heavy-x3"}} for _ in range(20)])
    Tenanted.start_many([{"arguments": {"tenant": "light"}} for _ in range(20)])

    claimed = _claim(12)

    assert _tenants(claimed).count("heavy-x3") == 9 and _tenants(claimed).count("light") == 3


@pytest.mark.django_db
def test_a_step_is_tagged_when_scheduled_due_and_a_keys_waiting_steps_one_spacing_apart(fair):
    first, second = _start("a", 2)
    a, b = scheduled(first), scheduled(second)

    assert (a.fair_key, b.fair_key) == ("tenant:a", "tenant:a")
    assert a.fair_at == a.scheduled_at
    assert b.fair_at == a.fair_at + FAIR_QUANTUM


@pytest.mark.django_db
def test_the_next_step_of_a_run_is_tagged_in_the_outcomes_batch(fair):
    _start("a", 3)
    [late] = _start("b", 1)

    for claimed in _claim(4):
        execute_step(claimed)  # each run's second step, scheduled due at once by the outcome

    second = scheduled(late)
    assert second.step_name == "second" and second.fair_key == "tenant:b" and second.fair_at is not None


@pytest.mark.django_db
def test_a_class_that_drops_its_fairness_leaves_no_step_stranded(fair, change_classes):
    tagged = _start("a", 3)
    change_classes(Tenanted, "fairness", None)  # the deploy that removes it

    claimed = _claim(10)

    assert sorted(step.run_id for step in claimed) == sorted(wf.record.pk for wf in tagged)


@pytest.mark.django_db
def test_a_changed_key_function_leaves_no_step_stranded(fair, change_classes):
    tagged = _start("a", 2)
    change_classes(Tenanted, "fairness", Fairness(key="everyone"))

    later = _start("b", 1)
    claimed = _claim(10)

    assert sorted(step.run_id for step in claimed) == sorted(wf.record.pk for wf in [*tagged, *later])


@pytest.mark.django_db
def test_classes_without_fairness_keep_the_claim_statement():
    plain = claim_steps(connection, True, 0, True)
    fair = claim_steps(connection, True, 0, True, True)

    # The steps' own columns, returned, include the new ones; nothing else of fairness is in the claim.
    def bare(text: str) -> str:
        for prefix in ("a.", "s."):
            text = text.replace(columns(connection, WorkflowStep, prefix), "")
        return text

    assert "fair" not in bare(plain)
    assert "fair_at" in bare(fair)


def test_a_fairness_is_checked_where_it_is_written():
    with pytest.raises(ConfigurationError):
        Fairness(key="")
    with pytest.raises(ConfigurationError):
        Fairness(key="x", weight=3)


@pytest.mark.django_db(transaction=True)
def test_a_fair_claim_reads_no_more_behind_thousands_of_keys_and_one_keys_long_backlog(fair):
    def claim():
        return claim_due_steps(1, claimed_by="d")

    Tenanted.start_many([{"arguments": {"tenant": "x"}} for _ in range(10)])
    settle(WorkflowStep, WorkflowRun, FanOutJob)
    alone = pages_read(claim, "AS step_key")
    Tenanted.start_many([{"arguments": {"tenant": "big"}} for _ in range(5_000)])
    Tenanted.start_many([{"arguments": {"tenant": f"t{n}"}} for n in range(2_000)])
    settle(WorkflowStep, WorkflowRun, FanOutJob)
    behind_them = pages_read(claim, "AS step_key")

    assert behind_them - alone <= MORE_PAGES, (alone, behind_them)
    assert len(claim()) == 1


@pytest.mark.django_db
def test_priority_comes_before_the_keys_turns(fair):
    _start("a", 3)
    [urgent] = _start("a", 1)
    WorkflowStep.objects.filter(pk=scheduled(urgent).pk).update(priority=-1)
    _start("b", 1)

    assert _claim(1)[0].run_id == urgent.record.pk


@pytest.mark.django_db
def test_a_key_with_nothing_waiting_starts_again_from_its_due_time(fair):
    _start("a", 3)
    _claim(3)

    [again] = _start("a", 1)

    step = scheduled(again)
    assert step.fair_at == step.scheduled_at


@pytest.mark.django_db
def test_a_bad_key_or_weight_at_start_is_a_value_error_and_nothing_is_written(change_classes):
    change_classes(Tenanted, "fairness", Fairness(key=lambda wf: wf.arguments["missing"]))
    with pytest.raises(ValueError, match=r"tenanted\.first: the Fairness key callable raised KeyError"):
        Tenanted.start(tenant="a")
    change_classes(Tenanted, "fairness", Fairness(key="k", weight=lambda key: 0))
    with pytest.raises(ValueError, match="weight must be an integer from 1 to 1000000"):
        Tenanted.start(tenant="a")

    assert not WorkflowRun.objects.filter(workflow_class=Tenanted.name).exists()


@pytest.mark.django_db
def test_a_held_class_is_not_claimed_and_its_steps_are_claimed_by_their_places_on_release(fair):
    _start("a", 3)
    late = _start("b", 1)
    hold_class(Tenanted, actor="ops", reason="down")

    assert _claim(10) == []
    release_class(Tenanted, actor="ops")

    claimed = _claim(2)
    assert late[0].record.pk in [step.run_id for step in claimed]


@pytest.mark.django_db
def test_a_full_concurrency_key_holds_its_steps_back_and_the_next_key_in_turn_is_taken(fair, change_classes):
    change_classes(Tenanted, "concurrency", Concurrency(key=lambda wf: f"c:{wf.arguments['tenant']}", limit=1))
    _start("a", 4)
    _start("b", 1)
    _start("c", 1)

    assert sorted(_tenants(_claim(10))) == ["a", "b", "c"]  # one of a's, its key full after it


@pytest.mark.django_db
def test_a_step_that_comes_due_after_a_wait_is_placed_by_a_claim_and_taken_in_turn(fair):
    _start("a", 30)
    later = start_run(Tenanted, None, arguments={"tenant": "b"}, delay=timedelta(minutes=5))
    step = scheduled(later)
    assert (step.fair_key, step.fair_at) == ("tenant:b", None)  # its key alone: no place while it waits
    WorkflowStep.objects.filter(pk=step.pk).update(scheduled_at=clock.now())  # as if its five minutes had passed

    assert _tenants(_claim(2)) == ["a", "a"]  # a's first two; the claim places b's step, due now
    step = scheduled(later)
    assert step.fair_at == step.scheduled_at
    assert _tenants(_claim(1)) == ["b"]  # before a's third, placed a quantum after a's second


@pytest.mark.django_db
def test_a_steps_own_fairness_takes_the_place_of_its_classs(fair, change_classes):
    own = Fairness(key=lambda wf: f"step:{wf.arguments['tenant']}")
    steps = tuple(replace(d, fairness=own) if d.name == "first" else d for d in Tenanted._step_definitions)
    change_classes(Tenanted, "_step_definitions", steps)
    change_classes(Tenanted, "fairness", None)

    [wf] = _start("a", 1)

    assert scheduled(wf).fair_key == "step:a"
    execute_step(_claim(1)[0])
    assert scheduled(wf).fair_key == ""  # the second step: no fairness of its own, none on the class


def test_a_steps_fairness_is_checked_when_its_class_is_defined():
    with pytest.raises(ConfigurationError, match="fairness= must be a Fairness"):

        class Unfair(Workflow):
            name = "unfair_option"
            abstract = True

            @step(fairness="tenant")
            def only(self):
                return None


def test_a_class_registered_after_a_change_is_undone_is_in_the_claims_catalog():
    with changed_classes() as change:
        change(Tenanted, "fairness", TENANT_FAIRNESS)
        assert any_fairness() and "fairness_late" not in json.loads(catalog_json())  # cached for the changed classes

    class Late(Workflow):
        name = "fairness_late"

        @step
        def only(self):
            return None

    try:
        assert "fairness_late" in json.loads(catalog_json())  # else its steps are never claimed
    finally:
        registry.unregister("fairness_late")
