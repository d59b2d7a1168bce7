"""The insights page of a class: reached from the dashboard and the run list, its numbers linked to what they count.

The runs are ``tests/services/test_insights.py``'s; the page is fetched through the admin.
"""

import re
from datetime import timedelta
from html import unescape

import pytest
from django.urls import reverse
from django.utils import timezone

from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from tests.services.test_insights import runs  # noqa: F401  (the fixture)
from tests.support import VIEW, staff_user
from tests.testapp.limited_workflows import KeyedSleeper

pytestmark = pytest.mark.django_db

CLASS = "insights_onboarding"


def insights(workflow_class: str = CLASS, query: str = "") -> str:
    return reverse("admin:pgbus_workflows_insights", args=[workflow_class]) + query


def links(html: str) -> list[str]:
    return [unescape(href) for href in re.findall(r'href="([^"]+)"', html)]


def test_the_page_shows_the_pipeline_the_performance_and_the_funnel_with_charts(admin_client, runs):  # noqa: F811
    page = admin_client.get(insights()).content.decode()

    for section in ('id="pipeline"', 'id="performance"', 'id="funnel"'):
        assert section in page
    assert page.count('<svg class="pgbus-chart"') == 3
    assert "5 runs started; 2 finished." in page
    assert "Insights: insights_onboarding" in page
    assert ">80%<" in page  # verify and confirm: 4 of the 5 runs reached them


def test_every_count_links_to_a_list_that_shows_it(admin_client, runs):  # noqa: F811
    page = admin_client.get(insights()).content.decode()

    waiting = [url for url in links(page) if "current_step=confirm" in url and "status=waiting" in url]
    assert waiting
    listed = admin_client.get(waiting[0])
    assert listed.status_code == 200
    assert listed.context["cl"].result_count == 1
    assert {run.workflow_id for run in listed.context["cl"].result_list} == {runs["waiting"].workflow_id}

    failed = [url for url in links(page) if "step_name=verify" in url and "status__exact=failed" in url]
    listed = admin_client.get(failed[0])
    assert listed.status_code == 200
    assert [step.pk for step in listed.context["cl"].result_list] == list(
        WorkflowStep.objects.filter(step_name="verify", status="failed").values_list("pk", flat=True)
    )


def test_the_window_is_chosen_by_its_link_and_an_unknown_one_falls_back_to_24h(admin_client, runs):  # noqa: F811
    WorkflowStep.objects.filter(step_name="verify", status="failed").update(
        finished_at=timezone.now() - timedelta(hours=3)
    )

    def failed_verify(window: str) -> int:
        response = admin_client.get(insights(query=f"?window={window}"))
        return {row["step"]: row["failed"] for row in response.context["performance"]}["verify"]

    day = admin_client.get(insights(query="?window=24h"))
    assert day.context["window"] == "24h"
    assert "<strong>24h</strong>" in day.content.decode()
    assert 'href="?window=1h"' in day.content.decode()
    assert (failed_verify("1h"), failed_verify("6h"), failed_verify("24h")) == (0, 1, 1)
    assert admin_client.get(insights(query="?window=1y")).context["window"] == "24h"


def test_the_dashboard_and_the_filtered_run_list_link_to_each_class_insights(admin_client, runs):  # noqa: F811
    dashboard = admin_client.get(reverse("admin:pgbus_workflows_workflowrun_dashboard")).content.decode()
    assert insights() in links(dashboard)

    runs_of_class = reverse("admin:pgbus_workflows_workflowrun_changelist") + f"?workflow_class={CLASS}"
    assert insights() in links(admin_client.get(runs_of_class).content.decode())
    unfiltered = admin_client.get(reverse("admin:pgbus_workflows_workflowrun_changelist")).content.decode()
    assert "pgbus-insights-link" not in unfiltered


def test_a_class_with_no_code_and_no_runs_is_not_found(admin_client):
    assert admin_client.get(insights("no_such_class")).status_code == 404


def test_a_renamed_away_class_still_has_its_page_from_its_rows(admin_client, runs):  # noqa: F811
    WorkflowRun.objects.filter(workflow_class=CLASS).update(workflow_class="insights_gone")

    page = admin_client.get(insights("insights_gone")).content.decode()

    assert "No class is registered under this name" in page
    assert "5 runs started" in page


def test_the_page_needs_the_view_permission_on_runs(client, django_user_model, runs):  # noqa: F811
    staff_user(django_user_model, "nobody")
    client.login(username="nobody", password="correct horse battery staple")
    assert client.get(insights()).status_code == 403

    staff_user(django_user_model, "viewer", *VIEW)
    client.login(username="viewer", password="correct horse battery staple")
    assert client.get(insights()).status_code == 200


def test_the_pipeline_shows_runs_a_limit_holds_back_as_held_back_not_ready(admin_client):
    for account in ("acme", "acme", "acme", "free"):
        KeyedSleeper.start(account=account)
    claim_due_steps(1, queues=["keyed"], claimed_by="test")

    response = admin_client.get(insights(KeyedSleeper.name))

    [row] = response.context["pipeline"]
    assert {cell["key"]: cell["count"] for cell in row["statuses"]} == {
        "ready": 1,
        "held_back": 2,
        "performing": 1,
        "waiting": 0,
        "paused": 0,
    }
    head = response.content.decode().split('id="pipeline"', 1)[1].split("</thead>", 1)[0]
    assert '<span class="pgbus-badge pgbus-s-held_back">Held back</span>' in head
