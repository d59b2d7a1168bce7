"""Limits held by real ``run_workflow_dispatcher`` processes: two dispatchers share them, a SIGKILL frees a slot."""

from collections import defaultdict
from itertools import combinations

import pytest

from pgbus_workflows.models import Dispatcher, WorkflowEvent, WorkflowLimiter, WorkflowRun, WorkflowStep
from tests.procs import eventually
from tests.testapp.limited_workflows import KeyedGate, KeyedSleeper, RateLimited, Unlimited
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

#: Short thresholds so a crash is detected in seconds, not the production minute.
FAST = {
    "SWEEP_INTERVAL": 0.5,
    "HEARTBEAT_INTERVAL": 0.5,
    "DISPATCHER_DEAD_AFTER": 2,
    "POLL_INTERVAL": 0.2,
}


def _all_finished(cls, count):
    return lambda: WorkflowRun.objects.filter(workflow_class=cls.name, status="finished").count() == count


def _intervals():
    """``{account: [(start id, end id), ...]}`` of the keyed bodies, from the rows they wrote, in id order."""
    opened, spans = {}, defaultdict(list)
    for effect in SideEffect.objects.filter(label__in=["keyed-start", "keyed-end"]).order_by("pk"):
        account = effect.key.split("|")[0]
        if effect.label == "keyed-start":
            assert account not in opened, f"account {account}: a step began while another of its key ran"
            opened[account] = effect.pk
        else:
            spans[account].append((opened.pop(account), effect.pk))
    assert not opened
    return spans


def test_two_dispatchers_never_run_two_steps_of_a_key_at_once_while_other_keys_run_side_by_side(dispatchers):
    dispatchers("--concurrency", "2", settings=FAST)
    dispatchers("--concurrency", "2", settings=FAST)
    eventually(lambda: Dispatcher.objects.count() == 2, what="both dispatchers to register")

    # Four keys at once need four threads: one dispatcher of two cannot take them all, so the
    # other claims too (a body of half a second outlasts a following dispatcher's delay).
    for _ in range(3):
        for account in range(4):
            KeyedSleeper.start(account=account, seconds=0.5)
    eventually(_all_finished(KeyedSleeper, 12), timeout=60, what="the 12 keyed runs to finish")

    spans = _intervals()  # asserts no two bodies of one account overlapped
    assert {account: len(s) for account, s in spans.items()} == {str(a): 6 for a in range(4)}
    side_by_side = any(
        a_start < b_end and b_start < a_end
        for (a, a_spans), (b, b_spans) in combinations(spans.items(), 2)
        for a_start, a_end in a_spans
        for b_start, b_end in b_spans
    )
    assert side_by_side, "steps of different keys never ran at the same time"
    claimers = set(
        WorkflowStep.objects.filter(run__workflow_class=KeyedSleeper.name).values_list("claimed_by", flat=True)
    )
    assert len(claimers) == 2, "both dispatchers claimed keyed steps"
    assert set(
        WorkflowLimiter.objects.filter(name__startswith="concurrency:account:").values_list("in_use", flat=True)
    ) == {0}


def test_a_rate_limit_shared_by_two_dispatchers_never_exceeds_its_budget_over_any_window(dispatchers):
    dispatchers("--concurrency", "4", settings=FAST)
    dispatchers("--concurrency", "4", settings=FAST)
    eventually(lambda: Dispatcher.objects.count() == 2, what="both dispatchers to register")

    RateLimited.start_many([{} for _ in range(20)])
    eventually(_all_finished(RateLimited, 20), timeout=60, what="the 20 rate-limited runs to finish")

    # The claims' times: a burst of five, then five a second. A claim reads its clock before
    # it locks the bucket, so a window is widened by a margin for that read.
    started = sorted(
        step.started_at.timestamp() for step in WorkflowStep.objects.filter(run__workflow_class=RateLimited.name)
    )
    assert len(started) == 20
    margin = 0.05
    for i, j in combinations(range(len(started)), 2):
        allowed = 5 + 5 * (started[j] - started[i] + margin)
        assert j - i + 1 <= allowed, f"{j - i + 1} claims within {started[j] - started[i]:.3f} s"
    assert started[-1] - started[0] >= 15 / 5 - margin, "20 starts at 5/s after a burst of 5 take 3 s"


def test_a_sigkilled_dispatcher_holds_its_slot_no_longer_than_the_stall_threshold(dispatchers):
    victim = dispatchers("--no-sweep", "--concurrency", "2", settings=FAST)
    first = KeyedSleeper.start(account="kill", seconds=60)
    eventually(lambda: SideEffect.objects.filter(label="keyed-start").exists(), what="the first body to start")
    second = KeyedSleeper.start(account="kill", seconds=0.01)
    assert WorkflowLimiter.objects.get(name="concurrency:account:kill").in_use == 1

    victim.kill()
    survivor = dispatchers("--concurrency", "2", settings=FAST)

    started = f"kill|{second.workflow_id}"
    eventually(
        lambda: SideEffect.objects.filter(label="keyed-start", key=started).exists(),
        timeout=30,
        what="the held-back run to take the freed slot",
    )
    killed = WorkflowStep.objects.filter(run=first.record, step_name="work").order_by("pk").first()
    assert killed.error_class.endswith("StepStalled"), survivor.output()
    assert WorkflowEvent.objects.filter(kind="step_stalled", step=killed).exists()


def _effect(label, wf):
    return SideEffect.objects.filter(label=label, key=str(wf.workflow_id)).first()


def test_a_cancelled_running_step_keeps_its_keys_slot_until_its_body_returns(dispatchers):
    dispatchers("--concurrency", "3", settings=FAST)  # a thread for each body, and one for the step under no limit
    first = KeyedGate.start(account="c")
    eventually(lambda: _effect("gate-start", first), what="the first body to start")
    second = KeyedGate.start(account="c")

    first.cancel(reason="test")
    # A step under no limit, due after the held-back one: once the dispatcher ran it, it had
    # the held-back step before it in every claim, and left it.
    barrier = Unlimited.start()
    eventually(lambda: _effect("unlimited", barrier), what="the dispatcher to claim past the held-back step")

    assert WorkflowStep.objects.get(run=second.record).status == "scheduled"
    assert _effect("gate-start", second) is None
    assert WorkflowLimiter.objects.get(name="concurrency:gate:c").in_use == 1

    SideEffect.objects.create(label="gate-open", key=str(first.workflow_id))
    eventually(lambda: _effect("gate-start", second), what="the held-back run to take the slot the body gave back")
    assert _effect("gate-start", second).pk > _effect("gate-end", first).pk
    assert WorkflowEvent.objects.filter(run=first.record, kind="outcome_discarded").exists()
    SideEffect.objects.create(label="gate-open", key=str(second.workflow_id))
    eventually(_all_finished(KeyedGate, 1), what="the second run to finish")
    assert WorkflowLimiter.objects.get(name="concurrency:gate:c").in_use == 0


def test_a_cancelled_step_whose_dispatcher_is_killed_gives_its_slot_back_at_the_next_sweep(dispatchers):
    victim = dispatchers("--no-sweep", "--concurrency", "2", settings=FAST)
    first = KeyedGate.start(account="killed")
    eventually(lambda: _effect("gate-start", first), what="the first body to start")
    second = KeyedGate.start(account="killed")
    first.cancel(reason="test")
    assert WorkflowLimiter.objects.get(name="concurrency:gate:killed").in_use == 1

    victim.kill()  # the cancelled body never returns
    dispatchers("--concurrency", "2", settings=FAST)

    eventually(lambda: _effect("gate-start", second), timeout=30, what="the held-back run to take the freed slot")
    assert _effect("gate-end", first) is None
    assert not WorkflowStep.objects.filter(run=first.record, holds_slots=True).exists()
    SideEffect.objects.create(label="gate-open", key=str(second.workflow_id))
    eventually(_all_finished(KeyedGate, 1), what="the second run to finish")
