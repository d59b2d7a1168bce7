"""Statements of named placeholders (``%(name)s``), bound from a mapping, and the claim's named row.

The claim's parameters and result columns are matched by name (``sql.claiming``'s
``claim_parameters`` and ``ClaimRow``), not by position across two modules.
"""

import pytest

from pgbus_workflows import sql
from pgbus_workflows.models import WorkflowEvent, WorkflowRun
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.sql import clock, rows
from pgbus_workflows.sql.claiming import _HEAD, ClaimRow, claim_parameters
from tests.testapp.workflows import ThreeSteps

pytestmark = pytest.mark.django_db


def test_a_name_used_twice_is_one_parameter_numbered_where_it_first_appears():
    assert sql.numbered("SELECT %(a)s, %(b)s, %(a)s, 100 %% 7") == "SELECT $1, $2, $1, 100 % 7"


def test_a_statement_of_named_placeholders_binds_a_mapping_on_the_server():
    with sql.bound_cursor() as cursor:
        cursor.execute("SELECT %(word)s::text || %(n)s::int::text || %(word)s::text", {"n": 5, "word": "x"})
        assert cursor.fetchone() == ("x5x",)


def test_named_and_positional_placeholders_in_one_statement_are_refused():
    with pytest.raises(ValueError, match="named placeholders or positional ones, not both"):
        sql.numbered("SELECT %(a)s, %s")


def test_a_mapping_without_a_placeholder_s_value_says_which():
    with sql.bound_cursor() as cursor, pytest.raises(KeyError, match=r"%\(missing\)s"):
        cursor.execute("SELECT %(here)s::int, %(missing)s::int", {"here": 1})


def test_a_list_for_named_placeholders_is_refused():
    with sql.bound_cursor() as cursor, pytest.raises(TypeError, match="takes a mapping, not list"):
        cursor.execute("SELECT %(here)s::int", [1])


def test_the_claim_row_names_the_columns_the_statement_selects_in_their_order():
    assert tuple(_HEAD) == ClaimRow._fields[: len(_HEAD)]
    assert ClaimRow._fields[len(_HEAD) :] == ("run", "step")


def test_every_placeholder_of_the_claim_has_a_value_in_its_parameters():
    names = sql._numbering(sql.statement("claim_steps", True, 2, False))[1]
    event = {attname: None for attname, _ in rows.insert_columns(WorkflowEvent, leave_out=("run_id", "step_id"))}
    params = claim_parameters(
        now=clock.now(),
        due_by=clock.now(),
        queues=["default"],
        limit=1,
        catalog=None,
        claimed_by="",
        stall_threshold=None,
        unknown=[("A", "a"), ("B", "b")],
        event=event,
    )
    assert set(names) == set(params)


def test_a_claim_reads_its_rows_by_name():
    run = ThreeSteps.start()
    (step,) = claim_due_steps(10, claimed_by="named")
    assert step.run.workflow_id == run.workflow_id and step.claimed_by == "named"
    assert isinstance(step.run, WorkflowRun) and step.status == "in_progress"
