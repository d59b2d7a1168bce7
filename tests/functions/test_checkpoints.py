"""Durable functions' checkpoints: recorded once, replayed without a call, numbered, checked in order.

Each function is a ``@durable`` class; runs move with the test helpers and the executor, and
everything is asserted on the rows (steps, events, the side effects table).
"""

import pytest

from pgbus_workflows import ConfigurationError, durable
from pgbus_workflows.dsl.deploy import can_run_step
from pgbus_workflows.functions import ENTRY
from pgbus_workflows.states import RunStatus
from tests.functions.bodies import effect
from tests.support import labels, steps_of

pytestmark = pytest.mark.django_db


@durable(name="durable_pages", allow_multiple=True)
def pages(ctx, count):
    total = ctx.step("count", lambda: count)
    seen = [ctx.step("page", effect(f"page {n}")) for n in range(total)]
    return {"pages": seen}


@durable(name="durable_branch", allow_multiple=True)
def branch(ctx, amount):
    size = ctx.step("measure", lambda: "big" if amount > 10 else "small")
    if size == "big":
        ctx.step("review", effect("review"))
    return ctx.step("ship", effect(f"ship {size}"))


def test_a_loop_numbers_repeated_names_and_returns_the_result(helpers):
    run = pages.start(None, count=3)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == {"pages": ["page 0", "page 1", "page 2"]}
    done = [s.step_name for s in steps_of(run) if s.step_name != ENTRY]
    assert done == ["count", "page", "page#2", "page#3"]
    assert labels() == ["page 0", "page 1", "page 2"]


def test_a_branch_on_recorded_data(helpers):
    big, small = branch.start(None, amount=20), branch.start(None, amount=1)
    helpers.speedrun_workflow(big)
    helpers.speedrun_workflow(small)
    assert big.result() == "ship big"
    assert small.result() == "ship small"
    assert [s.step_name for s in steps_of(small) if s.step_name != ENTRY] == ["measure", "ship"]


def test_the_arguments_subject_and_idempotency_key_are_there(helpers):
    keys = []

    @durable(name="durable_keys", allow_multiple=True)
    def keyed(ctx, n):
        return ctx.step("key", lambda: [ctx.step_idempotency_key, ctx.arguments, ctx.subject])

    run = keyed.start(None, n=4)
    helpers.speedrun_workflow(run)
    keys.append(run.result())
    assert keys == [[f"{run.workflow_id}:key", {"n": 4}, None]]


@durable(name="durable_the_result_row", allow_multiple=True)
def the_result_row(ctx):
    ctx.step("only", lambda: 1)
    return {"result": True}


def test_the_result_is_the_output_of_the_row_named_function(helpers):
    run = the_result_row.start(None)
    helpers.speedrun_workflow(run)
    last = steps_of(run)[-1]
    assert (last.step_name, last.output) == (ENTRY, {"result": True})
    assert run.result() == {"result": True}


def test_bad_declarations_and_calls_raise_configuration_error(helpers):
    with pytest.raises(ConfigurationError, match="not stages"):
        durable(name="durable_bad", stages=3)

    @durable(name="durable_bad_names", allow_multiple=True)
    def bad_names(ctx, name, option):
        return ctx.step(name, lambda: 1, **option)

    options = ({"stages": 3}, {"on_exception": 3}, {"on_exception": "skip"}, {"priority": "x"}, {"max_reattempts": 2})
    for name, option in (("a@b", {}), ("a#2", {}), ("", {}), *(("ok", o) for o in options)):
        run = bad_names.start(None, name=name, option=option)
        helpers.speedrun_workflow(run)
        assert run.reload().status == RunStatus.PAUSED
        assert "ConfigurationError" in run.record.paused_reason


def test_a_durable_class_accepts_a_signal_of_any_name():
    run = the_result_row.start(None)
    assert not run.signal("anything", {"n": 1}).duplicate_delivery


def test_a_dispatcher_knows_every_checkpoint_name_of_a_durable_class():
    assert can_run_step("durable_pages", "page#41")
    assert can_run_step("durable_pages", ENTRY)
    assert not can_run_step("durable_no_such_class", "page")
