"""``atomic=True`` checkpoints are exactly once: an attempt stalled while its body runs commits nothing.

Real commits (``transaction=True``): the sweep's stall comes from another connection while
the body's transaction is open, as it would from a dispatcher's sweep.
"""

import threading

import pytest
from django.db import connection

from pgbus_workflows import durable
from pgbus_workflows.functions import ENTRY
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.claims import stall
from pgbus_workflows.states import RunStatus, StepOutcomeKind, StepStatus
from tests.support import labels, record, steps_of

pytestmark = pytest.mark.django_db(transaction=True)

#: The attempts whose body had the sweep stall them from elsewhere.
STALLED: list[int] = []


def stalled_once(ctx):
    """A body that writes, then (on its first attempt) is stalled by another connection before it returns."""

    def body():
        record("exact")
        if not STALLED:
            row = WorkflowStep.objects.get(run__workflow_id=ctx.workflow_id, status=StepStatus.IN_PROGRESS)
            STALLED.append(row.pk)

            def sweep():
                try:
                    stall(row.pk, row.run_id, detection="timeout")
                finally:
                    connection.close()

            elsewhere = threading.Thread(target=sweep)
            elsewhere.start()
            elsewhere.join(timeout=60)
        return "written"

    return body


@durable(name="durable_exactly_once", allow_multiple=True)
def exactly_once(ctx):
    return ctx.step("exact", stalled_once(ctx), atomic=True)


def test_an_atomic_checkpoint_stalled_while_its_body_ran_commits_nothing_and_its_retry_commits_once(helpers):
    STALLED.clear()
    run = exactly_once.start(None)
    helpers.speedrun_workflow(run)
    assert run.reload().status == RunStatus.FINISHED
    assert run.result() == "written"
    assert labels() == ["exact"]  # the stalled attempt's write was rolled back with it
    # The stalled attempt is the function's row: a checkpoint's name comes with its outcome.
    stalled = next(s for s in steps_of(run) if s.pk == STALLED[0])
    assert (stalled.step_name, stalled.outcome) == (ENTRY, StepOutcomeKind.STALLED)
    exact = [(s.pk, s.outcome) for s in steps_of(run) if s.step_name == "exact"]
    assert [outcome for _pk, outcome in exact] == [StepOutcomeKind.SUCCESS]
    assert exact[0][0] > STALLED[0]
