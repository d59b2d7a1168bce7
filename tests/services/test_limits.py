"""``Concurrency(key, limit)`` and ``RateLimit(key, limit, per)``: enforced by the claim, shared by every dispatcher."""

from datetime import timedelta

import pytest

from pgbus_workflows import Concurrency, ConfigurationError, Debounce, Job, RateLimit, Workflow, fan_out, sql, step
from pgbus_workflows.models import FanOutJob, WorkflowLimiter, WorkflowRun, WorkflowStep
from pgbus_workflows.services.applying import apply_outcomes
from pgbus_workflows.services.chain import Chain
from pgbus_workflows.services.claims import claim_and_look_ahead, claim_due_steps, claim_step, stall
from pgbus_workflows.services.executor import execute_step, perform_step
from pgbus_workflows.services.fanout import claim_job, execute_job
from pgbus_workflows.services.limiting import describe, held_back
from pgbus_workflows.sql import clock
from tests.support import scheduled, statements_sent
from tests.testapp.jobs import square


class AccountSync(Workflow):
    """One sync per account at a time: the class's key, from the run's arguments."""

    name = "limits_account_sync"
    allow_multiple = True
    step_options = {"queue": "limits_account"}
    concurrency = Concurrency(key=lambda wf: f"account:{wf.arguments['account_id']}", limit=1)

    @step
    def push(self):
        return None

    @step
    def confirm(self):
        return None


class Ocr(Workflow):
    """A step's own key: at most two OCR calls at once, whatever the run."""

    name = "limits_ocr"
    allow_multiple = True
    step_options = {"queue": "limits_ocr"}

    @step
    def prepare(self):
        return None

    @step(concurrency=Concurrency(key="ocr-service", limit=2))
    def recognise(self):
        return None


class Charge(Workflow):
    """A token bucket: two charges per hour (a burst of two, then one every half hour)."""

    name = "limits_charge"
    allow_multiple = True
    step_options = {"queue": "limits_charge"}

    @step(rate_limit=RateLimit("limits-psp", limit=2, per=timedelta(hours=1)))
    def charge(self):
        return None


class BadKey(Workflow):
    name = "limits_bad_key"
    allow_multiple = True
    step_options = {"queue": "limits_bad"}

    @step
    def first(self):
        return None

    @step(concurrency=Concurrency(key=lambda wf: wf.arguments.get("key"), limit=1))
    def second(self):
        return None


def _claim(queue: str, limit: int = 10) -> list[WorkflowStep]:
    return claim_due_steps(limit, queues=[queue], claimed_by="test")


def _limiter(name: str) -> WorkflowLimiter:
    return WorkflowLimiter.objects.get(name=name)


# -- declarations --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Concurrency("k", limit=0), "Concurrency limit must be an integer of at least 1, got 0"),
        (lambda: Concurrency("k", limit=True), "Concurrency limit must be an integer of at least 1, got True"),
        (lambda: Concurrency("", limit=1), "Concurrency key must be a callable of the workflow or a non-empty"),
        (lambda: Concurrency("x" * 256, limit=1), "Concurrency key must be a callable"),
        (lambda: Concurrency(42, limit=1), "Concurrency key must be a callable"),
        (lambda: RateLimit("k", limit=0, per=1), "RateLimit limit must be an integer of at least 1, got 0"),
        (lambda: RateLimit("k", limit=5, per=0), "RateLimit per must be positive"),
        (lambda: RateLimit("k", limit=5, per=-1), "RateLimit per must not be negative"),
        (lambda: RateLimit("k", limit=5, per="1s"), "RateLimit per must be a timedelta or a number of seconds"),
    ],
)
def test_a_bad_limit_is_refused_where_it_is_written(make, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_a_limit_of_the_wrong_kind_is_refused_with_the_class_and_step_named():
    with pytest.raises(ConfigurationError, match=r"WrongClassLimit.concurrency must be a Concurrency"):

        class WrongClassLimit(Workflow):
            name = "limits_wrong_class"
            concurrency = RateLimit("k", limit=1, per=1)

            @step
            def only(self):
                return None

    with pytest.raises(ConfigurationError, match=r"WrongStepLimit.only: rate_limit= must be a RateLimit"):

        class WrongStepLimit(Workflow):
            name = "limits_wrong_step"

            @step(rate_limit=5)
            def only(self):
                return None


# -- concurrency keys ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_keys_steps_never_run_side_by_side_while_other_keys_run():
    first, second = AccountSync.start(account_id=1), AccountSync.start(account_id=1)
    other = AccountSync.start(account_id=2)

    claimed = _claim("limits_account")

    assert sorted(s.run_id for s in claimed) == sorted([first.record.pk, other.record.pk])
    assert _limiter("concurrency:account:1").in_use == 1
    assert _limiter("concurrency:account:2").in_use == 1
    assert scheduled(second).limiters == ["concurrency:account:1"]
    assert _claim("limits_account") == []  # the key's one slot is taken


@pytest.mark.django_db
def test_an_outcome_gives_the_slot_back_and_the_held_back_run_is_claimed_next():
    first, second = AccountSync.start(account_id=1), AccountSync.start(account_id=1)
    [claimed] = _claim("limits_account")
    assert claimed.run_id == first.record.pk

    execute_step(claimed)  # push completes; confirm is scheduled for the same key

    assert _limiter("concurrency:account:1").in_use == 0
    [following] = _claim("limits_account")
    # The held-back run was due first: it takes the slot before the first run's next step.
    assert following.run_id == second.record.pk
    assert _limiter("concurrency:account:1").in_use == 1


@pytest.mark.django_db
def test_a_claim_takes_only_as_many_steps_of_a_key_as_it_has_slots():
    runs = [Ocr.start() for _ in range(5)]
    for claimed in _claim("limits_ocr"):
        execute_step(claimed)  # prepare has no limit: all five move on to recognise

    recognising = _claim("limits_ocr")

    assert len(recognising) == 2
    assert _limiter("concurrency:ocr-service").in_use == 2
    assert {s.step_name for s in recognising} == {"recognise"}
    assert len(runs) == 5


@pytest.mark.django_db
def test_a_stall_found_by_the_sweep_gives_the_slot_back():
    AccountSync.start(account_id=3)
    held = AccountSync.start(account_id=3)
    [claimed] = _claim("limits_account")

    assert stall(claimed.pk, claimed.run_id, detection="dead_dispatcher")

    assert _limiter("concurrency:account:3").in_use == 0
    [following] = _claim("limits_account")
    assert following.run_id in {held.record.pk, claimed.run_id}


@pytest.mark.django_db
def test_a_claim_through_the_ledger_honours_the_limit_too():
    AccountSync.start(account_id=4)
    held = AccountSync.start(account_id=4)
    [claimed] = _claim("limits_account")

    assert claim_step(scheduled(held).pk, claimed_by="test") is None  # no slot: a no-op, nothing written
    assert scheduled(held).status == "scheduled"

    execute_step(claimed)
    assert claim_step(scheduled(held).pk, claimed_by="test") is not None
    assert _limiter("concurrency:account:4").in_use == 1


@pytest.mark.django_db
def test_a_held_back_step_says_which_key_holds_it_and_how_full_it_is():
    AccountSync.start(account_id=5)
    held = AccountSync.start(account_id=5)
    _claim("limits_account")

    holds = held_back(scheduled(held), clock.now())

    assert holds == [{"kind": "concurrency", "key": "account:5", "limit": 1, "in_use": 1}]
    assert describe(holds) == "concurrency key 'account:5' (1 of 1 in use)"


@pytest.mark.django_db
def test_a_key_callable_that_gives_no_string_fails_the_step_that_schedules_it_named():
    wf = BadKey.start(key=None)
    [claimed] = claim_due_steps(10, queues=["limits_bad"], claimed_by="test")

    execute_step(claimed)

    wf.reload()
    first = WorkflowStep.objects.get(pk=claimed.pk)
    assert "limits_bad_key.second: the Concurrency key must be a non-empty string" in first.error_message
    assert not WorkflowStep.objects.filter(run_id=wf.record.pk, step_name="second").exists()


# -- rate limits --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_rate_limit_lets_a_burst_of_its_limit_through_then_holds_until_a_token_refills():
    runs = [Charge.start() for _ in range(3)]

    claimed, ahead = claim_and_look_ahead(10, queues=["limits_charge"], claimed_by="test")

    assert len(claimed) == 2
    bucket = _limiter("rate:limits-psp")
    assert bucket.tokens == pytest.approx(0, abs=1e-6)
    # The third is due and held back: the loop's look-ahead wakes it when the next token comes.
    assert bucket.available_at is not None
    assert bucket.available_at - bucket.refilled_at == timedelta(minutes=30)
    assert ahead.next_due_at == bucket.available_at
    [held] = [r for r in runs if WorkflowStep.objects.filter(run_id=r.record.pk, status="scheduled").exists()]
    [hold] = held_back(scheduled(held), clock.now())
    assert (hold["kind"], hold["key"], hold["limit"]) == ("rate", "limits-psp", 2)

    # Half an hour later, one token: the third run's step is claimed.
    WorkflowLimiter.objects.filter(pk=bucket.pk).update(refilled_at=bucket.refilled_at - timedelta(minutes=30))
    [third] = claim_due_steps(10, queues=["limits_charge"], claimed_by="test")
    assert third.run_id == held.record.pk
    assert WorkflowRun.objects.filter(workflow_class=Charge.name, status="performing").count() == 3


class ApiClient(Workflow):
    """The flow control guide's worked example: keyed per account, and a rate limit the whole API shares."""

    name = "limits_api_client"
    allow_multiple = True
    step_options = {"queue": "limits_api"}
    concurrency = Concurrency(key=lambda wf: f"account:{wf.arguments['account_id']}", limit=1)

    @step(rate_limit=RateLimit("limits-crm-api", limit=100, per=timedelta(seconds=10)))
    def push(self):
        return None

    @step(wait_for="ack")
    def wait_for_ack(self):
        return None


class BadFirstKey(Workflow):
    name = "limits_bad_first_key"
    allow_multiple = True
    step_options = {"queue": "limits_bad_first"}
    concurrency = Concurrency(key=lambda wf: wf.arguments["missing"], limit=1)

    @step
    def only(self):
        return None


@pytest.mark.django_db
def test_a_step_under_the_class_and_its_own_limit_holds_both():
    wf = ApiClient.start(account_id=9)

    assert scheduled(wf).limiters == ["concurrency:account:9", "rate:limits-crm-api"]
    [claimed] = claim_due_steps(10, queues=["limits_api"], claimed_by="test")
    assert _limiter("concurrency:account:9").in_use == 1
    assert _limiter("rate:limits-crm-api").tokens == pytest.approx(99, abs=0.01)
    assert claimed.run_id == wf.record.pk


@pytest.mark.django_db
def test_a_waiting_step_holds_no_slot():
    first, second = ApiClient.start(account_id=10), ApiClient.start(account_id=10)
    for _ in range(4):  # push, then wait_for_ack, of both runs: one slot, taken and given back in turn
        for claimed in claim_due_steps(10, queues=["limits_api"], claimed_by="test"):
            execute_step(claimed)

    assert {first.reload().status, second.reload().status} == {"waiting"}
    assert _limiter("concurrency:account:10").in_use == 0


@pytest.mark.django_db
def test_a_first_step_key_that_raises_fails_the_start_and_writes_nothing():
    with pytest.raises(ValueError, match=r"limits_bad_first_key.only: the Concurrency key callable raised KeyError"):
        BadFirstKey.start(other=1)

    assert not WorkflowRun.objects.filter(workflow_class=BadFirstKey.name).exists()


class UnstorableKey(Workflow):
    name = "limits_unstorable_key"
    allow_multiple = True
    step_options = {"queue": "limits_unstorable"}
    concurrency = Concurrency(key=lambda wf: "account:" + chr(wf.arguments["code"]), limit=1)
    rate_limit = RateLimit(key=lambda wf: "api:" + chr(wf.arguments["code"]), limit=5, per=60)

    @step
    def only(self):
        return None


@pytest.mark.django_db
@pytest.mark.parametrize(("code", "said"), [(0, r"a NUL character \(\\x00\)"), (0xD800, r"a lone surrogate")])
def test_a_key_postgresql_cannot_store_is_a_value_error_naming_the_class_and_step(code, said):
    with pytest.raises(ValueError, match=rf"limits_unstorable_key.only: the Concurrency key .* \(contains {said}"):
        UnstorableKey.start(code=code)

    assert not WorkflowRun.objects.filter(workflow_class=UnstorableKey.name).exists()
    assert not WorkflowLimiter.objects.filter(name__startswith="rate:api:").exists()


@pytest.mark.parametrize("kind", [Concurrency, RateLimit])
@pytest.mark.parametrize("key", ["a\x00b", "a\udc80"])
def test_a_fixed_key_postgresql_cannot_store_is_refused_at_import(kind, key):
    with pytest.raises(ConfigurationError, match=rf"{kind.__name__} key must be .* without NUL or lone surrogates"):
        kind(key, limit=1) if kind is Concurrency else kind(key, limit=1, per=60)


@pytest.mark.django_db
def test_a_changed_declaration_writes_its_limit_when_a_step_is_scheduled_under_it(monkeypatch):
    AccountSync.start(account_id=11)
    assert _limiter("concurrency:account:11").limit == 1

    monkeypatch.setattr(AccountSync, "concurrency", Concurrency(key=AccountSync.concurrency.key, limit=3))
    AccountSync.start(account_id=11)

    assert _limiter("concurrency:account:11").limit == 3
    assert len(_claim("limits_account")) == 2


@pytest.mark.django_db
def test_steps_scheduled_under_a_limit_no_code_declares_any_more_are_claimed_within_its_rows(remove_limits):
    runs = [AccountSync.start(account_id=12) for _ in range(3)]
    remove_limits()

    [first] = _claim("limits_account")  # the row's limit of 1 still holds what it was scheduled under
    assert first.run_id == runs[0].record.pk and _limiter("concurrency:account:12").in_use == 1
    execute_step(first)  # gives the slot back; the run's next step is scheduled under no limit

    second = _claim("limits_account")
    assert sorted(s.run_id for s in second) == [runs[0].record.pk, runs[1].record.pk]
    assert scheduled(runs[2]).status == "scheduled"  # the key's one slot is taken again
    for attempt in second:
        execute_step(attempt)
    while claimed := _claim("limits_account"):
        for attempt in claimed:
            execute_step(attempt)
    assert {wf.reload().status for wf in runs} == {"finished"}
    assert _limiter("concurrency:account:12").in_use == 0


@pytest.mark.django_db
@pytest.mark.parametrize("claim", ["statement", "ledger"])
def test_a_step_whose_limiter_row_is_gone_is_claimed_as_one_without_limits(claim):
    runs = [AccountSync.start(account_id=13) for _ in range(2)]
    WorkflowLimiter.objects.filter(name="concurrency:account:13").delete()

    if claim == "statement":
        claimed = _claim("limits_account")
    else:
        claimed = [claim_step(scheduled(wf).pk, claimed_by="test") for wf in runs]

    assert sorted(s.run_id for s in claimed) == sorted(wf.record.pk for wf in runs)


@pytest.mark.django_db
def test_start_many_evaluates_a_key_callable_for_each_run():
    runs = AccountSync.start_many([{"arguments": {"account_id": n}} for n in (21, 22, 21)])

    assert [scheduled(wf).limiters for wf in runs] == [[f"concurrency:account:{n}"] for n in (21, 22, 21)]
    assert len(_claim("limits_account")) == 2


class FanOutUnderKey(Workflow):
    """A fan-out's body holds the key's slot; its jobs, running while the step waits, hold none."""

    name = "limits_fan_out"
    allow_multiple = True
    step_options = {"queue": "limits_fan"}

    @fan_out(concurrency=Concurrency(key="limits-fan", limit=1))
    def spread(self):
        return [Job(square, n) for n in range(3)]


@pytest.mark.django_db
def test_a_fan_out_holds_its_slot_while_its_body_runs_and_gives_it_back_while_its_jobs_run():
    first, second = FanOutUnderKey.start(), FanOutUnderKey.start()
    [claimed] = claim_due_steps(10, queues=["limits_fan"], claimed_by="test")
    assert _limiter("concurrency:limits-fan").in_use == 1

    execute_step(claimed)  # the jobs are opened: the step waits for them

    assert WorkflowStep.objects.get(pk=claimed.pk).status == "waiting"
    assert _limiter("concurrency:limits-fan").in_use == 0
    [following] = claim_due_steps(10, queues=["limits_fan"], claimed_by="test")
    assert {claimed.run_id, following.run_id} == {first.record.pk, second.record.pk}


@pytest.mark.django_db
def test_a_fan_out_resolved_by_its_last_job_gives_back_no_slot_it_did_not_take():
    first, second = FanOutUnderKey.start(), FanOutUnderKey.start()
    [opened] = claim_due_steps(10, queues=["limits_fan"], claimed_by="test")
    execute_step(opened)  # waiting for its jobs: the slot is free
    [running] = claim_due_steps(10, queues=["limits_fan"], claimed_by="test")  # the other run's body takes it
    assert _limiter("concurrency:limits-fan").in_use == 1

    for job in FanOutJob.objects.filter(step_id=opened.pk):
        execute_job(claim_job(job.pk, claimed_by="test"))

    # The first fan-out ended (in progress for a moment, without a claim): the second keeps its slot.
    assert WorkflowStep.objects.get(pk=opened.pk).status == "completed"
    assert _limiter("concurrency:limits-fan").in_use == 1
    assert WorkflowStep.objects.get(pk=running.pk).status == "in_progress"
    assert {opened.run_id, running.run_id} == {first.record.pk, second.record.pk}


def test_a_fixed_key_declared_with_two_limits_is_a_check_warning():
    from pgbus_workflows.checks import check_shared_limit_keys

    assert [m.id for m in check_shared_limit_keys()] == []  # every key of the test project agrees

    class OtherOcr(Workflow):
        name = "limits_other_ocr"
        allow_multiple = True

        @step(concurrency=Concurrency(key="ocr-service", limit=5))
        def recognise(self):
            return None

    try:
        [warning] = check_shared_limit_keys()
        assert warning.id == "pgbus_workflows.W013"
        assert warning.msg == (
            "The Concurrency key 'ocr-service' is declared with different limits: "
            "limit 2 by limits_ocr.recognise; limit 5 by limits_other_ocr.recognise."
        )
    finally:
        from pgbus_workflows.dsl.declared import registry

        registry.unregister(OtherOcr.name)


@pytest.mark.django_db
def test_a_key_with_no_room_never_delays_another_keys_step_due_after_its_own():
    crowd = [AccountSync.start(account_id=30) for _ in range(5)]
    other = AccountSync.start(account_id=31)  # due after all five

    claimed = claim_due_steps(3, queues=["limits_account"], claimed_by="test")

    assert sorted(s.run_id for s in claimed) == sorted([crowd[0].record.pk, other.record.pk])


@pytest.mark.django_db
def test_an_outcome_hands_its_slot_to_the_runs_next_step_on_the_same_worker_when_no_step_waits_for_it():
    wf = AccountSync.start(account_id=40)
    [claimed] = _claim("limits_account")
    chain = Chain(claimed_by="test")

    execute_step(claimed, chain=chain)

    [following] = chain.take()  # claimed in the outcome's transaction, slot and all
    assert (following.run_id, following.step_name, following.status) == (wf.record.pk, "confirm", "in_progress")
    assert _limiter("concurrency:account:40").in_use == 1


@pytest.mark.django_db
def test_a_run_keeps_its_keys_slot_from_one_step_to_the_next_when_they_follow_at_once_on_its_worker():
    first, second = AccountSync.start(account_id=41), AccountSync.start(account_id=41)
    [claimed] = _claim("limits_account")
    chain = Chain(claimed_by="test")

    execute_step(claimed, chain=chain)

    [following] = chain.take()  # the first run's confirm, on the same worker: the slot stays taken
    assert (following.run_id, following.step_name) == (first.record.pk, "confirm")
    assert _limiter("concurrency:account:41").in_use == 1
    assert _claim("limits_account") == []  # the second run still waits
    execute_step(following)  # the run's last step: its slot is given back
    assert [s.run_id for s in _claim("limits_account")] == [second.record.pk]


class PrepareThenCharge(Workflow):
    name = "limits_prepare_then_charge"
    allow_multiple = True
    step_options = {"queue": "limits_prepare"}

    @step
    def prepare(self):
        return None

    @step(rate_limit=RateLimit("limits-prepare-psp", limit=5, per=timedelta(seconds=1)))
    def charge(self):
        return None


@pytest.mark.django_db
def test_a_step_under_a_rate_limit_is_never_chained_it_spends_its_token_in_a_claim():
    wf = PrepareThenCharge.start()
    [prepared] = claim_due_steps(10, queues=["limits_prepare"], claimed_by="test")
    chain = Chain(claimed_by="test")

    execute_step(prepared, chain=chain)

    assert chain.take() == []
    assert scheduled(wf).step_name == "charge"
    [charged] = claim_due_steps(10, queues=["limits_prepare"], claimed_by="test")
    assert charged.step_name == "charge"
    assert _limiter("rate:limits-prepare-psp").tokens == pytest.approx(4, abs=0.01)


class DebouncedUnderKey(Workflow):
    """Debounced and keyed by the same argument: a collapse may move the run to another key."""

    name = "limits_debounced"
    allow_multiple = True
    step_options = {"queue": "limits_debounced"}
    debounce = Debounce(period=timedelta(seconds=30), key=lambda wf: f"order:{wf.arguments['order']}")
    concurrency = Concurrency(key=lambda wf: f"warehouse:{wf.arguments['warehouse']}", limit=1)

    @step
    def ship(self):
        return None


@pytest.mark.django_db
def test_a_collapsed_start_puts_the_first_step_under_the_keys_of_the_latest_arguments():
    wf = DebouncedUnderKey.start(order=1, warehouse="north")
    assert scheduled(wf).limiters == ["concurrency:warehouse:north"]

    again = DebouncedUnderKey.start(order=1, warehouse="south")

    assert again.debounced and again.workflow_id == wf.workflow_id
    assert scheduled(wf).limiters == ["concurrency:warehouse:south"]
    assert _limiter("concurrency:warehouse:south").limit == 1


class ClassRate(Workflow):
    """A class-level RateLimit: every step of its runs spends a token of the bucket."""

    name = "limits_class_rate"
    allow_multiple = True
    step_options = {"queue": "limits_class_rate"}
    rate_limit = RateLimit("limits-class-bucket", limit=3, per=timedelta(hours=1))

    @step
    def first(self):
        return None

    @step
    def second(self):
        return None


@pytest.mark.django_db
def test_a_class_rate_limit_spends_a_token_for_every_step_of_its_runs():
    runs = [ClassRate.start(), ClassRate.start()]

    firsts = claim_due_steps(10, queues=["limits_class_rate"], claimed_by="test")
    for claimed in firsts:
        execute_step(claimed)  # two tokens spent; both runs' second steps are due
    seconds = claim_due_steps(10, queues=["limits_class_rate"], claimed_by="test")

    assert [s.step_name for s in firsts] == ["first", "first"]
    assert [s.step_name for s in seconds] == ["second"]  # the third token
    assert claim_due_steps(10, queues=["limits_class_rate"], claimed_by="test") == []
    [waiting] = [wf for wf in runs if wf.record.pk != seconds[0].run_id]
    [hold] = held_back(scheduled(waiting), clock.now())
    assert (hold["kind"], hold["key"], hold["limit"]) == ("rate", "limits-class-bucket", 3)


@pytest.mark.django_db
def test_a_batch_of_outcomes_gives_back_every_units_slots_in_one_statement_in_name_order():
    for account in (61, 60, 62):
        AccountSync.start(account_id=account)
    claimed = _claim("limits_account")
    performed = [perform_step(step) for step in claimed]

    with statements_sent() as seen:
        apply_outcomes(performed)

    releases = [text for text in seen if text == sql.statement("release_slots")]
    assert len(releases) == 1  # one statement locks the three rows in one order: two batches never deadlock
    slots = WorkflowLimiter.objects.filter(name__in=[f"concurrency:account:{n}" for n in (60, 61, 62)])
    assert set(slots.values_list("in_use", flat=True)) == {0}
