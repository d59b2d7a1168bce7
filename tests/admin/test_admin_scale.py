"""What the admin shows when a table is large: "about N" counts, pages past them, no costly sort.

The runs are written in SQL (``generate_series``), then analyzed, as a year of history would
be; the admin is fetched as a superuser through Django's test client.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.paginator import EmptyPage
from django.db import connection
from django.db.models.functions import Length
from django.urls import reverse

from pgbus_workflows.admin.paging import DEEPEST_PAGE, EstimatedCountPaginator, count_label
from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.services.stuck import GAUGE_EXACT_UP_TO, gauge
from pgbus_workflows.sql import clock
from pgbus_workflows.sql.counting import EXACT_UP_TO, distinct_values, estimated_count
from tests.management.test_cli import paused_on_error, ready

pytestmark = pytest.mark.django_db

RUNS = WorkflowRun._meta.db_table


def fill(count: int, klass: str = "history", status: str = "finished") -> None:
    """``count`` runs of ``klass`` in ``status``, then fresh statistics."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {RUNS} (workflow_id, workflow_class, status, current_step, arguments, allow_multiple,
                  paused_reason, created_at, started_at, finished_at, status_changed_at)
                SELECT gen_random_uuid(), %s, %s, 'c', '{{}}', true, '', now(), now(), now(), now()
                FROM generate_series(1, %s)""",
            [klass, status, count],
        )
        cursor.execute(f"ANALYZE {RUNS}")


def changelist(query: str = "") -> str:
    return reverse("admin:pgbus_workflows_workflowrun_changelist") + query


def count_line(html: str) -> str:
    return re.search(r'<span class="pgbus-count">(.*?)</span>', html, re.S).group(1).strip()


def test_a_small_list_is_counted_exactly(admin_client):
    for _ in range(3):
        ready()
    response = admin_client.get(changelist())
    assert count_line(response.content.decode()) == "3 workflow runs"
    assert response.context["cl"].paginator.estimated is False


def test_a_large_list_says_about_the_planners_estimate(admin_client):
    fill(5000)
    response = admin_client.get(changelist())
    cl = response.context["cl"]
    assert cl.paginator.estimated is True
    assert 4000 <= cl.result_count <= 6000  # the planner's estimate of 5,000 rows
    # Rounded to two significant digits, with a thousands separator: "about 5,000", not "about 4987".
    assert re.fullmatch(r"about [456],\d00 workflow runs", count_line(response.content.decode()))
    assert re.search(r"Select all \(about [456],\d00\)", response.content.decode())
    searched = admin_client.get(changelist("?workflow_class=history")).content.decode()
    assert re.search(r"about [456],\d00 results", searched)
    # A filtered list that is small again is exact.
    wf = paused_on_error()
    filtered = admin_client.get(changelist("?status=paused"))
    assert count_line(filtered.content.decode()) == "1 workflow run"
    assert [run.pk for run in filtered.context["cl"].result_list] == [wf.record.pk]


def test_an_estimated_list_pages_a_hundred_pages_deep_and_links_no_deeper(admin_client):
    fill(6000)
    page = admin_client.get(changelist("?p=100"))  # the deepest: 5,000 runs before it
    assert len(page.context["cl"].result_list) == 50
    html = page.content.decode()
    # Django 5.2 marks the current page with a span, Django 6 with an aria-current link.
    current = ('<span class="this-page">100</span>', '<a role="button" href="" aria-current="page">100</a>')
    assert any(mark in html for mark in current) and "?p=99" in html
    assert "?p=101" not in html and "?p=120" not in html
    first = admin_client.get(changelist()).content.decode()
    assert "?p=2" in first and "?p=120" not in first  # the estimate's last pages are not offered
    # Deeper is refused (Django's ?e=1), as is a page before the first.
    assert admin_client.get(changelist("?p=101")).status_code == 302
    assert admin_client.get(changelist("?p=0")).status_code == 302


def test_a_page_past_a_low_estimate_is_served():
    fill(3000)
    # The planner cannot see into length(current_step) = 1: it guesses 0.5% of the rows, all match.
    runs = WorkflowRun.objects.annotate(n=Length("current_step")).filter(n=1).order_by("-pk")
    paginator = EstimatedCountPaginator(runs, 50)
    assert paginator.estimated and paginator.count == EXACT_UP_TO + 1  # never below what it counted
    assert paginator.count_text == "more than 1,000"  # not "about 1001": the planner knew no more
    assert len(paginator.page(50).object_list) == 50  # 2,450 runs in: past the estimate's 21 pages
    assert len(paginator.page(61).object_list) == 0
    with pytest.raises(EmptyPage):
        paginator.page(DEEPEST_PAGE + 1)


@pytest.mark.parametrize(
    ("count", "estimated", "shown"),
    [
        (7, False, "7"),
        (1050, False, "1,050"),
        (1001, True, "more than 1,000"),
        (1050, True, "about 1,100"),
        (4987, True, "about 5,000"),
        (1_234_567, True, "about 1,200,000"),
    ],
)
def test_a_count_reads_with_thousands_separators_and_an_estimate_rounded(count, estimated, shown):
    assert count_label(count, estimated, exact_up_to=1000) == shown


def test_estimated_count_is_exact_up_to_its_bound_and_never_below_what_it_counted():
    fill(EXACT_UP_TO)
    assert estimated_count(WorkflowRun.objects.order_by("-pk")) == (EXACT_UP_TO, False)
    fill(1, klass="other")
    count, estimated = estimated_count(WorkflowRun.objects.order_by("-pk"))
    assert estimated is True and count >= EXACT_UP_TO + 1


def test_unindexed_columns_are_not_sortable_even_by_url(admin_client):
    fill(10)
    response = admin_client.get(changelist("?o=4"))  # the status column
    assert response.status_code == 200
    cl = response.context["cl"]
    assert cl.get_ordering_field_columns() == {}
    assert '"status"' not in str(cl.queryset.query).split("ORDER BY")[1]
    html = response.content.decode()
    header = html.split('id="result_list"')[1].split("</thead>")[0]
    assert header.count('class="sortable') == 1  # the run's id only (its unique index orders it)


def test_class_choices_come_from_the_registry_and_the_class_index(admin_client):
    fill(3, klass="retired_class")  # runs of a class the code no longer has
    assert distinct_values(WorkflowRun, "workflow_class") == ["retired_class"]
    html = admin_client.get(changelist()).content.decode()
    assert "?workflow_class=retired_class" in html and "?workflow_class=three_steps" in html


def test_the_gauge_estimates_a_class_and_status_above_its_bound_and_the_dashboard_says_about(admin_client):
    fill(GAUGE_EXACT_UP_TO + 2000, klass="busy")
    paused_on_error()
    counts = {(r["workflow_class"], r["status"]): r["count"] for r in gauge(clock.now())["statuses"]}
    assert 0.8 * (GAUGE_EXACT_UP_TO + 2000) <= counts[("busy", "finished")]
    assert counts[("busy", "finished")] > GAUGE_EXACT_UP_TO
    assert counts[("fails_first", "paused")] == 1 and counts[("busy", "paused")] == 0
    html = admin_client.get(reverse("admin:pgbus_workflows_workflowrun_dashboard")).content.decode()
    assert re.search(r">about 1\d,\d00</a>", html)  # the estimate, rounded, with a thousands separator
    assert ">1</a>" in html  # the paused run, counted exactly


def test_a_bulk_action_over_a_large_selection_says_about_how_many(admin_client):
    fill(3000, status="ready")
    first = WorkflowRun.objects.order_by("pk").first()
    response = admin_client.post(
        changelist(), {"action": "pause_runs", "select_across": "1", "index": "0", ACTION_CHECKBOX_NAME: [first.pk]}
    )
    assert response.status_code == 200
    assert "and about" in response.content.decode()


def test_lists_search_runs_by_workflow_id_only(admin_client):
    wf = paused_on_error()
    step = WorkflowStep.objects.get(run=wf.record)
    steps = reverse("admin:pgbus_workflows_workflowstep_changelist")
    found = admin_client.get(steps, {"q": str(wf.workflow_id)[:8]}).context["cl"].result_list
    assert [s.pk for s in found] == [step.pk]
    assert list(admin_client.get(steps, {"q": "flaky"}).context["cl"].result_list) == []
    assert "A workflow id, or its first 8 hex digits or more." in admin_client.get(steps).content.decode()


def test_the_lists_filter_by_indexed_choices_only(admin_client):
    paused_on_error()

    def sidebar(model: str) -> str:
        html = admin_client.get(reverse(f"admin:pgbus_workflows_{model}_changelist")).content.decode()
        return html.split('id="changelist-filter"')[1]

    steps, events = sidebar("workflowstep"), sidebar("workflowevent")
    assert "?status__exact=failed" in steps and "?finished_within=1h" in steps and "?workflow_class=" in steps
    assert "?queue=" not in steps and "?outcome__exact=" not in steps
    assert "?kind=step_failed" in events and "?kind=paused" in events
    assert "?kind=step_started" not in events and "?actor=" not in events  # routine kinds, free values
    assert "?name=" not in sidebar("workflowsignal") and "?function=" not in sidebar("fanoutjob")
