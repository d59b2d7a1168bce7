"""Fairness: claims take the due steps of several keys in turn (weighted), across dispatchers, with no per-key scan."""

import pytest
from django.db import connection

from pgbus_workflows import Fairness
from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.dsl.fairness import FAIR_QUANTUM
from pgbus_workflows.exceptions import ConfigurationError
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.sql.claiming import claim_steps
from pgbus_workflows.sql.statements import columns
from tests.support import scheduled
from tests.testapp.fair_workflows import TENANT_FAIRNESS, Tenanted

TENANTS = ["tenants"]


@pytest.fixture
def fair(monkeypatch):
    """``Tenanted`` with its fairness declared (the catalog then has a class with fairness)."""
    monkeypatch.setattr(Tenanted, "fairness", TENANT_FAIRNESS)
    monkeypatch.setattr(registry, "version", registry.version + 1)


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

    for step in _claim(4):
        execute_step(step)  # each run's second step, scheduled due at once by the outcome

    second = scheduled(late)
    assert second.step_name == "second" and second.fair_key == "tenant:b" and second.fair_at is not None


@pytest.mark.django_db
def test_a_class_that_drops_its_fairness_leaves_no_step_stranded(fair, monkeypatch):
    tagged = _start("a", 3)
    monkeypatch.setattr(Tenanted, "fairness", None)  # the deploy that removes it
    monkeypatch.setattr(registry, "version", registry.version + 1)

    claimed = _claim(10)

    assert sorted(step.run_id for step in claimed) == sorted(wf.record.pk for wf in tagged)


@pytest.mark.django_db
def test_a_changed_key_function_leaves_no_step_stranded(fair, monkeypatch):
    tagged = _start("a", 2)
    monkeypatch.setattr(Tenanted, "fairness", Fairness(key="everyone"))

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
