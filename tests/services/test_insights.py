"""``services.insights.class_insights``: a class's pipeline, its steps' performance and its funnel.

Runs are made by the engine (started, stepped, signalled, cancelled), then a few rows' times
are moved to put them in or out of the window; every figure is asserted exactly.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from pgbus_workflows import OnException, Workflow, step
from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import run_due_steps
from pgbus_workflows.services.insights import WINDOWS, _percentiles, class_insights
from tests.testapp.limited_workflows import KeyedSleeper
from tests.testapp.models import Order

Q = "insights_q"
DAY = WINDOWS["24h"]


class Onboarding(Workflow):
    name = "insights_onboarding"
    step_options = {"queue": Q}
    allow_multiple = True

    @step
    def welcome(self):
        pass

    @step(on_exception=OnException(ValueError, action="reattempt", wait=timedelta(0), max_reattempts=2))
    def verify(self):
        if self.arguments.get("flaky") and self.attempt == 1:
            raise ValueError("the mail server said try again")

    @step(wait_for="confirmed")
    def confirm(self):
        pass

    @step
    def done(self):
        pass


def run_all() -> None:
    while run_due_steps(queues=[Q]):
        pass


@pytest.fixture
def runs(db):
    """Five runs: two finished (one after a reattempt), one waiting to confirm, one cancelled there, one ready."""
    order = Order.objects.create()
    made = {
        "plain": Onboarding.start(order),
        "flaky": Onboarding.start(order, flaky=True),
        "waiting": Onboarding.start(order),
        "cancelled": Onboarding.start(order),
    }
    run_all()
    made["plain"].signal("confirmed")
    made["flaky"].signal("confirmed")
    run_all()
    made["cancelled"].cancel("customer left")
    made["ready"] = Onboarding.start(order)  # its first step not yet run
    return {name: wf.reload() for name, wf in made.items()}


def test_the_pipeline_counts_the_ongoing_runs_at_each_step_by_status(runs):
    data = class_insights("insights_onboarding", DAY)

    assert data["steps"] == ["welcome", "verify", "confirm", "done"]
    assert data["registered"] is True
    pipeline = {row["step"]: row for row in data["pipeline"]}
    assert set(pipeline) == {"welcome", "confirm"}
    assert pipeline["welcome"]["counts"] == {"ready": 1, "held_back": 0, "performing": 0, "waiting": 0, "paused": 0}
    assert pipeline["confirm"]["counts"] == {"ready": 0, "held_back": 0, "performing": 0, "waiting": 1, "paused": 0}
    assert [row["step"] for row in data["pipeline"]] == ["welcome", "confirm"]  # in the class's order


@pytest.mark.django_db
def test_the_pipeline_counts_ready_runs_a_limit_holds_back_apart_from_the_ready_ones():
    for account in ("acme", "acme", "acme", "free"):
        KeyedSleeper.start(account=account)
    claim_due_steps(1, queues=["keyed"], claimed_by="test")  # acme's one slot: its two other runs wait for it

    [row] = class_insights(KeyedSleeper.name, DAY)["pipeline"]

    assert row["counts"] == {"ready": 1, "held_back": 2, "performing": 1, "waiting": 0, "paused": 0}
    assert row["total"] == 4


def test_step_performance_counts_the_windows_attempts_by_how_they_ended(runs):
    data = class_insights("insights_onboarding", DAY)

    rows = {row["step"]: row for row in data["performance"]}
    assert rows["welcome"]["attempts"] == 4
    verify = rows["verify"]
    assert (verify["attempts"], verify["completed"], verify["failed"], verify["reattempts"]) == (5, 4, 1, 1)
    assert verify["failure_rate"] == pytest.approx(1 / 5)
    assert verify["reattempt_rate"] == pytest.approx(1 / 5)
    assert rows["confirm"]["completed"] == 2
    assert rows["confirm"]["cancelled"] == 1  # the cancel ended the waiting attempt
    assert rows["done"]["attempts"] == 2
    for row in data["performance"]:
        assert 0 <= row["p50_seconds"] <= row["p95_seconds"]


def test_an_attempt_that_finished_before_the_window_is_not_counted(runs):
    WorkflowStep.objects.filter(run_id=runs["flaky"].record.pk, step_name="verify", attempt=1).update(
        finished_at=timezone.now() - 2 * DAY
    )

    verify = {row["step"]: row for row in class_insights("insights_onboarding", DAY)["performance"]}["verify"]

    assert (verify["attempts"], verify["failed"], verify["reattempts"]) == (4, 0, 1)
    week = {row["step"]: row for row in class_insights("insights_onboarding", WINDOWS["7d"])["performance"]}
    assert week["verify"]["failed"] == 1


def test_the_percentiles_are_the_durations_from_claim_to_end(runs):
    now = timezone.now()
    for seconds, wf in zip((1, 2, 3, 4), ("plain", "flaky", "waiting", "cancelled"), strict=True):
        WorkflowStep.objects.filter(run_id=runs[wf].record.pk, step_name="welcome").update(
            started_at=now - timedelta(minutes=5, seconds=seconds), finished_at=now - timedelta(minutes=5)
        )

    welcome = {row["step"]: row for row in class_insights("insights_onboarding", DAY, now)["performance"]}["welcome"]

    # percentile_cont over 1, 2, 3, 4 s: 2.5 s and 3.85 s, read from the durations' histogram
    assert welcome["p50_seconds"] == pytest.approx(2.5, rel=0.045)
    assert welcome["p95_seconds"] == pytest.approx(3.85, rel=0.045)


def test_the_python_percentiles_match_percentile_cont():
    p50, p95 = _percentiles([1.0, 2.0, 3.0, 4.0])
    assert (p50.total_seconds(), p95.total_seconds()) == (pytest.approx(2.5), pytest.approx(3.85))
    assert _percentiles([]) == (None, None)
    assert _percentiles([7.0]) == (timedelta(seconds=7), timedelta(seconds=7))


def test_the_funnel_follows_the_runs_the_window_started(runs):
    funnel = class_insights("insights_onboarding", DAY)["funnel"]

    assert (funnel["started"], funnel["finished"]) == (5, 2)
    steps = {row["step"]: row for row in funnel["steps"]}
    assert [steps[name]["reached"] for name in ("welcome", "verify", "confirm", "done")] == [5, 4, 4, 2]
    assert steps["welcome"]["reached_rate"] == pytest.approx(1.0)
    assert steps["done"]["reached_rate"] == pytest.approx(2 / 5)
    assert steps["welcome"]["here"] == {"ready": 1}
    assert steps["confirm"]["here"] == {"waiting": 1, "cancelled": 1}
    assert steps["done"]["here"] == {}  # the finished runs are not "here"


def test_a_run_started_before_the_window_leaves_the_funnel_but_not_the_pipeline(runs):
    WorkflowRun.objects.filter(pk=runs["waiting"].record.pk).update(started_at=timezone.now() - 2 * DAY)

    data = class_insights("insights_onboarding", DAY)

    assert data["funnel"]["started"] == 4
    assert {row["step"]: row["counts"]["waiting"] for row in data["pipeline"]}["confirm"] == 1


def test_a_class_no_longer_registered_is_shown_from_its_rows(runs):
    WorkflowRun.objects.filter(workflow_class="insights_onboarding").update(workflow_class="insights_renamed_away")

    data = class_insights("insights_renamed_away", DAY)

    assert data["registered"] is False
    assert set(data["steps"]) == {"welcome", "verify", "confirm", "done"}
    assert data["funnel"]["started"] == 5


@pytest.mark.django_db
def test_an_unknown_class_is_a_lookup_error_naming_it():
    with pytest.raises(LookupError, match=r"No workflow class 'no_such_class'"):
        class_insights("no_such_class", DAY)


@pytest.mark.django_db
def test_a_registered_class_without_runs_has_empty_figures():
    data = class_insights("insights_onboarding", DAY)

    assert (data["pipeline"], data["performance"]) == ([], [])
    assert data["funnel"]["started"] == 0
    assert [row["reached_rate"] for row in data["funnel"]["steps"]] == [None] * 4
