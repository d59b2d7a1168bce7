"""A property test: a durable function replayed after random crashes records what an uninterrupted run does.

Hypothesis writes small programs (a DSL of checkpoints with repeated names, sleeps, and waits
for a signal sent before the wait, after it, or never: its timeout) that one durable function
interprets from its arguments. Each program runs twice on real PostgreSQL with the test helpers:
once uninterrupted, once with crashes, and the two runs must record the same sequence of
checkpoint names and outputs and finish with the same result; the crashed run's attempts run
either through the helpers or as a dispatcher's worker with other work in hand, whose calls end
at each new checkpoint and write it with their outcome. The crashes are of two kinds:

- a ``BaseException`` raised once inside a checkpoint's body after its side effect (the result
  is lost: the body runs again), or in the function's own code before or after a checkpoint;
  the class's policy reattempts it, and the function replays from the top;
- a dispatcher that dies holding a claim: the attempt is claimed by a dispatcher whose heartbeat
  is an hour old, and the sweep stalls it (the body never ran), as after a SIGKILL.

Every body runs once in the uninterrupted run, and once more per crash inside it in the other.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgbus_workflows import OnException, durable
from pgbus_workflows.dispatcher.sweep import Sweeper
from pgbus_workflows.functions import ENTRY
from pgbus_workflows.models import Dispatcher, WorkflowStep
from pgbus_workflows.services import operator
from pgbus_workflows.services.applying import apply_outcomes
from pgbus_workflows.services.chain import Chain
from pgbus_workflows.services.claims import claim_step
from pgbus_workflows.services.executor import perform_step
from pgbus_workflows.services.waiting import waiting_step
from pgbus_workflows.states import RunStatus, StepStatus
from pgbus_workflows.workflow import Workflow
from tests.functions.conftest import Helpers
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.slow]

#: The dispatcher that "dies" holding a claim (its heartbeat an hour old when the sweep looks).
DEAD = "replay-dead"


class Crash(BaseException):
    """A crash in the middle of an attempt: not an ``Exception``, so no ``except Exception`` stops it."""


def _crash_once(ctx: Any, index: int, where: str) -> None:
    """Raise :class:`Crash` at ``(index, where)`` the first time the run gets there, if the program says so."""
    if [index, where] not in ctx.arguments["crashes"]:
        return
    label = f"crash {ctx.workflow_id} {index} {where}"
    if not SideEffect.objects.filter(label=label).exists():
        SideEffect.objects.create(label=label)
        raise Crash(label)


def _body(ctx: Any, index: int, value: int) -> Any:
    def body() -> int:
        SideEffect.objects.create(label="body", key=ctx.step_idempotency_key)
        _crash_once(ctx, index, "body")  # after the side effect: its result is lost
        return value

    return body


@durable(
    name="durable_program",
    allow_multiple=True,
    exception_policies=[OnException(Crash, action="reattempt", wait=timedelta(0), max_reattempts=50)],
)
def interpret(ctx, ops, crashes):
    """Run the program ``ops``: ``[kind, name, value]`` each; returns the outputs of steps and waits."""
    outputs = []
    for index, (kind, name, value) in enumerate(ops):
        _crash_once(ctx, index, "before")
        if kind == "step":
            outputs.append(ctx.step(name, _body(ctx, index, value)))
        elif kind == "sleep":
            ctx.sleep(name, timedelta(seconds=value))
        else:
            outputs.append(ctx.wait_for(f"s{index}", timeout=timedelta(hours=1)))
        _crash_once(ctx, index, "after")
    return outputs


STEP = st.tuples(st.just("step"), st.sampled_from(["a", "b", "c"]), st.integers(0, 9))
SLEEP = st.tuples(st.just("sleep"), st.sampled_from(["nap", "rest"]), st.sampled_from([0, 60, 3600]))
WAIT = st.tuples(st.just("wait"), st.just(""), st.sampled_from(["early", "late", "timeout"]))
PROGRAMS = st.lists(st.one_of(STEP, STEP, SLEEP, WAIT).map(list), min_size=1, max_size=8)


@st.composite
def programs_and_crashes(draw: Any) -> tuple[list[list[Any]], list[list[Any]], set[int], bool]:
    """A program, the crashes raised in it (``[index, where]``), the claims a dead dispatcher holds,
    and whether its attempts run as a dispatcher's worker with other work in hand (commits shared)."""
    ops = draw(PROGRAMS)
    spots = st.tuples(st.integers(0, len(ops) - 1), st.sampled_from(["before", "body", "after"])).map(list)
    crashes = draw(st.lists(spots, max_size=4, unique_by=tuple))
    kills = draw(st.sets(st.integers(0, 3 * len(ops) + 2), max_size=3))
    return ops, crashes, kills, draw(st.booleans())


def _perform_as_a_busy_worker(run: Workflow) -> None:
    """Claim the run's due attempt and run it, and the rows its outcomes chain, as a worker with other work in hand.

    Each call then ends at its new checkpoint, written with the call's outcome (``services.checkpoint_end``).
    """
    step = WorkflowStep.objects.get(run_id=run.record.pk, status=StepStatus.SCHEDULED)
    if step.scheduled_at > timezone.now():
        operator.run_now(run.record.pk, actor="test", reason="due now")
    chain = Chain("busy-worker", None, others_waiting=lambda: True)
    queue = [claim_step(step.pk, claimed_by="busy-worker")]
    while queue:
        performed = [perform_step(claimed, chain=chain, verify=False) for claimed in queue if claimed is not None]
        apply_outcomes([done for done in performed if isinstance(done, tuple)], chain)
        queue = chain.take()


def _die_holding_a_claim(run: Workflow) -> None:
    """Claim the run's scheduled attempt as a dispatcher that then dies; the sweep stalls the attempt."""
    step = WorkflowStep.objects.filter(run_id=run.record.pk, status=StepStatus.SCHEDULED).order_by("pk").last()
    assert step is not None
    if step.scheduled_at > timezone.now():
        operator.run_now(run.record.pk, actor="test", reason="a claim before its time")
    Dispatcher.objects.update_or_create(
        name=DEAD, defaults={"hostname": DEAD, "pid": 1, "heartbeat_at": timezone.now() - timedelta(hours=1)}
    )
    assert claim_step(step.pk, claimed_by=DEAD) is not None
    summary = Sweeper().run()
    assert summary is not None and "failed" not in summary, summary
    assert run.reload().status == RunStatus.READY, "the sweep stalls the dead dispatcher's attempt"


def _run_to_end(
    helpers: Helpers, ops: list[list[Any]], crashes: list[list[Any]], kills: set[int], shared: bool = False
) -> Workflow:
    run = interpret.start(None, ops=ops, crashes=crashes)
    for index, (kind, _, mode) in enumerate(ops):
        if kind == "wait" and mode == "early":
            run.signal(f"s{index}", {"early": index})
    for moves in range(1000):
        status = run.reload().status
        if status == RunStatus.FINISHED:
            return run
        if status == RunStatus.READY:
            if moves in kills:
                _die_holding_a_claim(run)
            elif shared:
                _perform_as_a_busy_worker(run)
            else:
                helpers.perform_next_step(run)
        elif status == RunStatus.WAITING:
            step = waiting_step(run.record)
            assert step is not None
            index = int(step.step_name[1:])
            if ops[index][2] == "late":
                run.signal(step.step_name, {"late": index})  # the woken attempt may meet a dead dispatcher too
            else:
                helpers.expire_wait(run)
        else:
            raise AssertionError(f"the run is {status} ({run.record.paused_reason}) after {moves} moves")
    raise AssertionError("the run did not finish in 1000 moves")


def _recorded(run: Workflow) -> list[tuple[str, Any]]:
    return list(
        WorkflowStep.objects.filter(run_id=run.record.pk, status=StepStatus.COMPLETED, outcome="success")
        .exclude(step_name=ENTRY)
        .order_by("pk")
        .values_list("step_name", "output")
    )


def _bodies(run: Workflow) -> Counter[str]:
    keys = SideEffect.objects.filter(label="body", key__startswith=f"{run.workflow_id}:").values_list("key", flat=True)
    return Counter(key.split(":", 1)[1] for key in keys)


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(programs_and_crashes())
def test_a_replay_after_crashes_records_what_an_uninterrupted_run_does(transactional_db, helpers, drawn):
    ops, crashes, kills, shared = drawn

    clean = _run_to_end(helpers, ops, [], set())
    if shared:  # uninterrupted too: crashes make every call read the rows again
        busy = _run_to_end(helpers, ops, [], set(), shared)
        assert (_recorded(busy), busy.result(), _bodies(busy)) == (_recorded(clean), clean.result(), _bodies(clean))
    crashed = _run_to_end(helpers, ops, crashes, kills, shared)

    assert _recorded(crashed) == _recorded(clean)
    assert crashed.result() == clean.result()
    assert set(_bodies(clean).values()) <= {1}
    names = dict(_step_checkpoints(ops))
    body_crashes = Counter(names[index] for index, where in crashes if where == "body" and index in names)
    assert _bodies(crashed) == _bodies(clean) + body_crashes
    assert not WorkflowStep.objects.filter(run_id=crashed.record.pk, status=StepStatus.IN_PROGRESS).exists()


def _step_checkpoints(ops: list[list[Any]]) -> list[tuple[int, str]]:
    """The checkpoint name of each step op: ``name``, ``name#2``... (sleeps number their own names)."""
    counts: Counter[str] = Counter()
    named = []
    for index, (kind, name, _) in enumerate(ops):
        if kind == "step":
            counts[name] += 1
            named.append((index, name if counts[name] == 1 else f"{name}#{counts[name]}"))
    return named
