"""What a new checkpoint costs in a dispatcher: one transaction, as a step's outcome, and none before its body.

The same for an ``async def`` function (its database calls come back to this thread here, as
the test helpers await it).

The function's row takes the checkpoint's name in the transaction that records its output and
claims the next row for the same worker (``functions.checkpoints.record``). Counted with
Django's ``CaptureQueriesContext`` on PostgreSQL, through the executor as a dispatcher's worker
calls it.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pgbus_workflows import durable
from pgbus_workflows.functions import ENTRY
from pgbus_workflows.services.chain import Chain
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.states import RunStatus, StepOutcomeKind
from tests.support import steps_of

pytestmark = pytest.mark.django_db(transaction=True)

#: The COMMITs counted when each checkpoint's body ran.
COMMITS_BEFORE: list[int] = []
#: The capture the bodies count in.
CAPTURED: list[CaptureQueriesContext] = []


def _commits(captured: CaptureQueriesContext) -> int:
    return sum(1 for query in captured.captured_queries if query["sql"] == "COMMIT")


def noted(value):
    """A checkpoint body that notes how many COMMITs were sent before it ran; returns ``value``."""

    def body():
        COMMITS_BEFORE.append(_commits(CAPTURED[0]))
        return value

    return body


@durable(name="durable_cost_three", allow_multiple=True)
def three(ctx):
    return [ctx.step(name, noted(name)) for name in "abc"]


@durable(name="durable_cost_three_async", allow_multiple=True)
async def three_async(ctx):
    return [await ctx.step(name, noted(name)) for name in "abc"]


@durable(name="durable_cost_timed", allow_multiple=True)
def timed(ctx):
    return ctx.step("slow", noted(1), timeout=60)


def _drain(run):
    """Claim the run's row for ``worker`` and run it through the executor as a dispatcher's worker does."""
    [claimed] = claim_due_steps(10, None, "worker")
    COMMITS_BEFORE.clear()
    with CaptureQueriesContext(connection) as captured:
        CAPTURED[:] = [captured]
        execute_step(claimed, chain=Chain("worker", None), verify=False)
    return captured


@pytest.mark.parametrize("function", [three, three_async], ids=["def", "async def"])
def test_three_new_checkpoints_commit_three_times_and_the_run_end_once(function):
    run = function.start(None)
    captured = _drain(run)
    assert COMMITS_BEFORE == [0, 1, 2]  # no commit of its own before a body: the rename goes with the output
    assert _commits(captured) == 4
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == ["a", "b", "c"]
    rows = [(s.step_name, s.attempt, s.outcome, s.claimed_by) for s in steps_of(run)]
    assert rows == [
        ("a", 1, StepOutcomeKind.SUCCESS, "worker"),
        ("b", 1, StepOutcomeKind.SUCCESS, "worker"),
        ("c", 1, StepOutcomeKind.SUCCESS, "worker"),
        (ENTRY, 1, StepOutcomeKind.SUCCESS, "worker"),
    ]


def test_a_checkpoint_with_a_route_of_its_own_is_renamed_before_its_body():
    """A ``timeout=`` the function's row lacks is the attempt's from its start: that row is written first."""
    run = timed.start(None)
    _drain(run)
    assert COMMITS_BEFORE == [1]
    assert run.reload().status == RunStatus.FINISHED
    assert [s.step_name for s in steps_of(run)] == ["slow", ENTRY]
