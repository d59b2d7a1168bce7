"""``debounce = Debounce(...)``: starts of one key collapse into the run whose first step has not begun."""

import threading
from datetime import UTC, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import pgbus_workflows
from pgbus_workflows import AlreadyRunning, ConfigurationError, Debounce, Workflow, sql, step
from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.services import schedules as schedule_verbs
from pgbus_workflows.services.claims import claim_step
from pgbus_workflows.sql import clock, functions
from pgbus_workflows.workflow import Workflow as BareWorkflow
from tests.procs import eventually
from tests.support import events_of, kinds, run_next, scheduled, sessions_waiting_for_a_lock, steps_of
from tests.testapp.models import Order
from tests.threads import JOIN_TIMEOUT, Worker

PERIOD = timedelta(seconds=30)
MAX_WAIT = timedelta(minutes=5)


class DebouncedSync(Workflow):
    """The flow control guide's example: one run per account, the latest arguments."""

    name = "debounce_crm_sync"
    allow_multiple = True
    step_options = {"queue": "debounce_sync"}
    debounce = Debounce(period=PERIOD, key=lambda wf: f"account:{wf.arguments['account_id']}", max_wait=MAX_WAIT)

    @step
    def push(self):
        return None

    @step
    def confirm(self):
        return None


class DebouncedBySubject(Workflow):
    """No key: the subject is the key (one ongoing run per subject)."""

    name = "debounce_by_subject"
    step_options = {"queue": "debounce_subject"}
    debounce = Debounce(period=30)

    @step
    def push(self):
        return None


class DebouncedCapped(Workflow):
    name = "debounce_capped"
    step_options = {"queue": "debounce_capped"}
    debounce = Debounce(period=timedelta(seconds=30), max_wait=timedelta(seconds=60))

    @step
    def push(self):
        return None


KEYS = {"give": "k"}


class DebouncedBadKey(Workflow):
    name = "debounce_bad_key"
    allow_multiple = True
    step_options = {"queue": "debounce_bad_key"}
    debounce = Debounce(period=30, key=lambda wf: KEYS["give"] if "raise" not in wf.arguments else wf.arguments["no"])

    @step
    def push(self):
        return None


class DebouncedKeyOfSubject(Workflow):
    name = "debounce_key_of_subject"
    allow_multiple = True
    step_options = {"queue": "debounce_key_subject"}
    debounce = Debounce(period=30, key=lambda wf: f"order:{wf.subject.pk}")

    @step
    def push(self):
        return None


class NotDebounced(Workflow):
    name = "debounce_not_debounced"
    step_options = {"queue": "debounce_plain"}

    @step
    def push(self):
        return None


def _run_count(cls):
    return WorkflowRun.objects.filter(workflow_class=cls.name).count()


def _shift_back(wf, by):
    """As if the run had been created ``by`` earlier: its creation and its first step's due time move back."""
    run = WorkflowRun.objects.get(pk=wf.record.pk)
    WorkflowRun.objects.filter(pk=run.pk).update(created_at=run.created_at - by)
    step_row = scheduled(wf)
    WorkflowStep.objects.filter(pk=step_row.pk).update(scheduled_at=step_row.scheduled_at - by)


def _clock_time(moment, other):
    """How the event's note writes ``moment``: its UTC time, with the date when ``other``'s differs."""
    moment, other = moment.astimezone(UTC), other.astimezone(UTC)
    return f"{moment:%H:%M:%S}" if moment.date() == other.date() else f"{moment:%Y-%m-%d %H:%M:%S}"


# -- collapsing ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_starts_of_one_key_collapse_into_one_run_with_the_latest_arguments_and_an_event_each():
    first = DebouncedSync.start(account_id=7, note="a")
    second = DebouncedSync.start(account_id=7, note="b")
    third = DebouncedSync.start(account_id=7, note="c", extra=1)
    other = DebouncedSync.start(account_id=8, note="z")

    assert (first.debounced, second.debounced, third.debounced, other.debounced) == (False, True, True, False)
    assert first.workflow_id == second.workflow_id == third.workflow_id != other.workflow_id
    assert _run_count(DebouncedSync) == 2
    run = WorkflowRun.objects.get(pk=first.record.pk)
    assert run.arguments == {"account_id": 7, "note": "c", "extra": 1}
    assert run.debounce_key == "account:7"
    assert third.arguments == run.arguments
    assert kinds(first) == ["started", "debounced", "debounced"]
    debounced = events_of(first, "debounced")
    assert [e.details["arguments"] for e in debounced] == [
        {"account_id": 7, "note": "b"},
        {"account_id": 7, "note": "c", "extra": 1},
    ]
    assert debounced[-1].details["scheduled_at"] == scheduled(first).scheduled_at.isoformat()
    assert debounced[-1].details["previous_scheduled_at"] == debounced[0].details["scheduled_at"]
    assert [s.step_name for s in steps_of(first)] == ["push"]  # one attempt, moved: none added


@pytest.mark.django_db
def test_the_first_start_schedules_the_first_step_a_period_later():
    wf = DebouncedSync.start(account_id=1)
    assert scheduled(wf).scheduled_at - wf.record.created_at == PERIOD


@pytest.mark.django_db
def test_a_collapsed_start_moves_the_first_step_to_a_period_from_now():
    wf = DebouncedSync.start(account_id=2)
    _shift_back(wf, timedelta(seconds=20))
    earlier = scheduled(wf).scheduled_at
    before = clock.now()
    DebouncedSync.start(account_id=2)
    after = clock.now()
    moved = scheduled(wf).scheduled_at
    assert before + PERIOD <= moved <= after + PERIOD
    assert moved - earlier >= timedelta(seconds=20)
    [event] = events_of(wf, "debounced")
    assert "max_wait_reached" not in event.details
    # The event says when the first step was due and when it is now: in its details, and as its note.
    assert (event.details["previous_scheduled_at"], event.details["scheduled_at"]) == (
        earlier.isoformat(),
        moved.isoformat(),
    )
    assert event.reason == f"push moved from {_clock_time(earlier, moved)} to {_clock_time(moved, earlier)} UTC"


@pytest.mark.django_db
def test_max_wait_after_the_runs_creation_bounds_the_first_steps_time(order):
    wf = DebouncedCapped.start(order)
    _shift_back(wf, timedelta(seconds=45))  # now + period would be 75 s after the creation
    again = DebouncedCapped.start(order)
    assert again.debounced
    run = WorkflowRun.objects.get(pk=wf.record.pk)
    assert scheduled(wf).scheduled_at == run.created_at + timedelta(seconds=60)
    [event] = events_of(wf, "debounced")
    assert event.details["max_wait_reached"] is True
    assert event.reason.endswith(" UTC (max_wait)")


@pytest.mark.django_db
def test_without_a_key_the_subject_is_the_key_and_subject_less_starts_share_one(order):
    other = Order.objects.create()
    a = DebouncedBySubject.start(order, n=1)
    b = DebouncedBySubject.start(order, n=2)
    c = DebouncedBySubject.start(other, n=3)
    d = DebouncedBySubject.start(n=4)
    e = DebouncedBySubject.start(n=5)
    assert a.workflow_id == b.workflow_id and b.debounced
    assert c.workflow_id != a.workflow_id and not c.debounced
    assert d.workflow_id == e.workflow_id and e.debounced and not d.debounced
    assert _run_count(DebouncedBySubject) == 3
    assert WorkflowRun.objects.get(pk=a.record.pk).debounce_key == f"testapp.order:{order.pk}"


@pytest.mark.django_db
def test_a_collapsed_start_about_another_subject_leaves_the_runs_subject_and_its_event_names_its_own(order):
    other = Order.objects.create()
    wf = DebouncedSync.start(order, account_id=9)
    same = DebouncedSync.start(order, account_id=9, n=1)
    elsewhere = DebouncedSync.start(other, account_id=9, n=2)
    assert same.debounced and elsewhere.debounced and elsewhere.workflow_id == wf.workflow_id
    run = WorkflowRun.objects.get(pk=wf.record.pk)
    assert (run.subject_type, run.subject_id) == ("testapp.order", str(order.pk))
    first, second = events_of(wf, "debounced")
    assert "subject" not in first.details
    assert second.details["subject"] == ["testapp.order", str(other.pk)]


@pytest.mark.django_db
def test_the_key_callable_reads_the_subject_given(order):
    a = DebouncedKeyOfSubject.start(order, n=1)
    b = DebouncedKeyOfSubject.start(order, n=2)
    assert b.debounced and b.workflow_id == a.workflow_id
    assert WorkflowRun.objects.get(pk=a.record.pk).debounce_key == f"order:{order.pk}"


# -- once the first step began -------------------------------------------------------------------------


@pytest.mark.django_db
def test_once_the_first_step_began_a_start_is_a_normal_start(order):
    wf = DebouncedBySubject.start(order)
    run_next(wf)  # claimed and done: the run finished (one step)
    again = DebouncedBySubject.start(order)
    assert not again.debounced and again.workflow_id != wf.workflow_id

    claimed = DebouncedBySubject.start(Order.objects.create())
    assert claim_step(scheduled(claimed).pk, "test") is not None  # in progress
    with pytest.raises(AlreadyRunning):
        DebouncedBySubject.start(claimed.subject)
    assert kinds(claimed) == ["started", "step_started"]


@pytest.mark.django_db
def test_a_paused_run_takes_no_more_starts(order):
    wf = DebouncedBySubject.start(order)
    wf.pause(actor="alice")
    with pytest.raises(AlreadyRunning):
        DebouncedBySubject.start(order)
    assert "debounced" not in kinds(wf)


@pytest.mark.django_db
def test_a_run_past_its_first_step_is_left_alone_and_the_next_start_makes_a_run_starts_collapse_into():
    wf = DebouncedSync.start(account_id=3)
    run_next(wf)  # push done: confirm is scheduled, the run is ready again
    assert wf.status == "ready"
    newer = DebouncedSync.start(account_id=3, n=1)
    newest = DebouncedSync.start(account_id=3, n=2)
    assert not newer.debounced and newer.workflow_id != wf.workflow_id
    assert newest.debounced and newest.workflow_id == newer.workflow_id
    assert "debounced" not in kinds(wf)


# -- start_many, reruns (idempotency keys: test_debounce_idempotency.py) --------------------------------------


@pytest.mark.django_db
def test_start_many_of_a_debounced_class_is_refused_and_writes_nothing():
    with pytest.raises(ConfigurationError, match="DebouncedSync has debounce: start_many"):
        DebouncedSync.start_many([{"arguments": {"account_id": 1}}])
    assert _run_count(DebouncedSync) == 0


@pytest.mark.django_db
def test_a_rerun_is_not_debounced(order):
    wf = DebouncedBySubject.start(order)
    wf.cancel(actor="alice")
    rerun = wf.rerun(actor="alice")
    assert WorkflowRun.objects.get(pk=rerun.record.pk).debounce_key is None
    assert scheduled(rerun).scheduled_at == rerun.record.created_at  # due now: its first step has no wait


@pytest.mark.django_db
def test_a_schedules_tick_is_not_debounced():
    pending = DebouncedSync.start(account_id=6)
    schedule = DebouncedSync.add_schedule(every=60, arguments={"account_id": 6}, overlap="allow", name="debounced")
    wf = schedule_verbs.fire_now(schedule.pk, actor="alice")
    assert not wf.debounced and wf.workflow_id != pending.workflow_id
    assert WorkflowRun.objects.get(pk=wf.record.pk).debounce_key is None
    assert "debounced" not in kinds(pending)


# -- bad keys and bad declarations ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("give", "arguments", "message"),
    [
        ("k", {"raise": 1}, r"DebouncedBadKey.debounce key raised KeyError: 'no'; nothing was started"),
        (42, {}, r"DebouncedBadKey.debounce key must be a non-empty string of at most 255 characters .*, got 42"),
        ("a\x00b", {}, r"got 'a\\x00b' \(contains a NUL character \(\\x00\)\); nothing was started"),
        ("a\ud800", {}, r"got 'a\\ud800' \(contains a lone surrogate \('\\ud800'\)\); nothing was started"),
        ("", {}, r"DebouncedBadKey.debounce key must be a non-empty string"),
        ("x" * 256, {}, r"DebouncedBadKey.debounce key must be a non-empty string of at most 255"),
    ],
)
def test_a_key_callable_that_fails_raises_naming_the_class_and_nothing_is_written(
    monkeypatch, give, arguments, message
):
    monkeypatch.setitem(KEYS, "give", give)
    with pytest.raises(ValueError, match=message):
        DebouncedBadKey.start(**arguments)
    assert _run_count(DebouncedBadKey) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"period": 0}, "Debounce period must be positive, got 0"),
        ({"period": -5}, "Debounce period must not be negative"),
        ({"period": "30s"}, "Debounce period must be a timedelta or a number of seconds"),
        ({"period": 30, "max_wait": 0}, "Debounce max_wait must be positive"),
        ({"period": 30, "max_wait": 10}, r"Debounce max_wait \(0:00:10\) must be at least its period \(0:00:30\)"),
        ({"period": 30, "key": ""}, "Debounce key must be None, a callable"),
        ({"period": 30, "key": 5}, "Debounce key must be None, a callable"),
        ({"period": 30, "key": "k" * 256}, "Debounce key must be None, a callable"),
        ({"period": 30, "key": "k\x00"}, "Debounce key must be None, a callable.* without NUL or lone surrogates"),
    ],
)
def test_bad_debounce_arguments_are_configuration_errors_naming_the_argument(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        Debounce(**kwargs)


def test_periods_are_seconds_or_timedeltas_and_max_wait_may_equal_the_period():
    declared = Debounce(period=30, key="all", max_wait=timedelta(seconds=30))
    assert (declared.period, declared.max_wait, declared.key) == (PERIOD, PERIOD, "all")


def test_allow_multiple_without_a_key_is_refused_at_class_definition():
    with pytest.raises(ConfigurationError, match=r"DebounceNoKey.debounce needs a key: with allow_multiple=True"):

        class DebounceNoKey(Workflow):
            name = "debounce_no_key"
            allow_multiple = True
            debounce = Debounce(period=30)

            @step
            def push(self):
                return None


def test_a_debounce_that_is_not_a_debounce_is_refused():
    with pytest.raises(ConfigurationError, match=r"DebounceNotOne.debounce must be a Debounce"):

        class DebounceNotOne(Workflow):
            name = "debounce_not_one"
            debounce = 30


def test_the_first_step_of_a_debounced_class_takes_no_wait():
    with pytest.raises(ConfigurationError, match=r"DebounceFirstWaits.push: the first step of a debounced class"):

        class DebounceFirstWaits(Workflow):
            name = "debounce_first_waits"
            debounce = Debounce(period=30)

            @step(wait=60)
            def push(self):
                return None


def test_debounce_is_exported_and_a_class_has_none_unless_it_says():
    assert "Debounce" in pgbus_workflows.__all__
    assert BareWorkflow.debounce is None and NotDebounced.debounce is None


# -- concurrency and the start function ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_starts_of_one_key_at_once_on_two_connections_make_one_run():
    """The first start holds the key until it commits; the second waits for it, then collapses into its run."""
    started = threading.Event()
    release = threading.Event()

    def first_start():
        with transaction.atomic():
            wf = DebouncedSync.start(account_id=99, by="first")
            started.set()
            assert release.wait(JOIN_TIMEOUT)
        return wf

    def second_start():
        assert started.wait(JOIN_TIMEOUT)
        return DebouncedSync.start(account_id=99, by="second")

    first, second = Worker(first_start), Worker(second_start)
    first.start()
    second.start()
    assert started.wait(JOIN_TIMEOUT)
    eventually(sessions_waiting_for_a_lock, what="the second start to wait for the key the first holds")
    assert second.is_alive(), "the second start did not wait for the first's transaction"
    release.set()
    a, b = first.finish(), second.finish()
    assert (a.debounced, b.debounced) == (False, True)
    assert a.workflow_id == b.workflow_id
    assert _run_count(DebouncedSync) == 1
    assert WorkflowRun.objects.get(workflow_class=DebouncedSync.name).arguments == {"account_id": 99, "by": "second"}


@pytest.fixture
def unprepared(monkeypatch):
    """A web process's connection: not allowed to prepare, new to start() (as in tests/test_start_function.py)."""
    monkeypatch.setattr(sql, "_prepared_at", set())
    connection.close()
    connection.ensure_connection()


def _sent(queries):
    return [q["sql"] for q in queries.captured_queries if q["sql"] != "SELECT clock_timestamp()"]


@pytest.mark.django_db(transaction=True)
def test_past_a_connections_fifth_start_a_debounced_class_still_debounces(unprepared):
    for _ in range(functions.THRESHOLD + 1):
        NotDebounced.start(Order.objects.create())
    order = Order.objects.create()
    with CaptureQueriesContext(connection) as queries:
        NotDebounced.start(order)
    assert _sent(queries)[0].startswith(f"SELECT * FROM public.{functions.PREFIX}")  # the function's path
    handles = []
    with CaptureQueriesContext(connection) as queries:
        for n in range(functions.THRESHOLD + 2):
            handles.append(DebouncedSync.start(account_id=5, n=n))
    assert [h.debounced for h in handles] == [False] + [True] * (functions.THRESHOLD + 1)
    assert _run_count(DebouncedSync) == 1
    assert kinds(handles[0]).count("debounced") == functions.THRESHOLD + 1
    assert not any(functions.PREFIX in text or text.startswith("WITH r AS") for text in _sent(queries))


@pytest.mark.django_db
def test_a_class_without_debounce_sends_the_one_statement_it_sent_before():
    NotDebounced.start(Order.objects.create())  # the connection's statements are built
    order = Order.objects.create()
    with CaptureQueriesContext(connection) as queries:
        NotDebounced.start(order)
    sent = _sent(queries)
    assert len(sent) == 1, sent
    assert "advisory" not in sent[0] and 'debounce_key" = ' not in sent[0]
