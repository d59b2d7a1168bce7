"""A class's runs list behind a campaign's newer runs: read from the class's own index entries.

20,000 finished runs of an older class, then 15,000 runs of a campaign started since, waiting
for their next step: the newest rows of the table are all the campaign's. Ordered by id, the
older class's list (its count and its page) walked the primary key past every one of them,
the planner taking the class's runs to be spread evenly over the key. Ordered by start, the
class's index (``pgbus_wf_run_class_started``) gives the order; no scan may go through more
rows than a bounded count reads.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.operating.runs import list_runs
from tests.admin.test_admin_plans import HOT, MAX_ROWS_READ, analyze, assert_indexed, changelist, fetch

pytestmark = pytest.mark.django_db

RUNS, STEPS = WorkflowRun._meta.db_table, WorkflowStep._meta.db_table
OLDER, CAMPAIGN = 20_000, 15_000

FILL = f"""INSERT INTO {RUNS} (workflow_id, workflow_class, status, current_step, arguments, allow_multiple,
      paused_reason, created_at, started_at, finished_at, status_changed_at, subject_type, subject_id)
    SELECT gen_random_uuid(), %s, %s, 'c', '{{}}', false, '', now() - n * interval '1 minute',
           now() - n * interval '1 minute', NULL, now() - n * interval '1 minute', 'testapp.order', %s || n
    FROM generate_series(1, %s) AS n"""
#: An attempt of each run (the list shows each run's latest).
STEP_FILL = f"""INSERT INTO {STEPS} (run_id, step_name, attempt, status, outcome, reattempt_reason, queue, priority,
      scheduled_at, started_at, finished_at, claimed_by, error_class, error_message, traceback, timed_out, created_at)
    SELECT id, 'c', 1, 'completed', 'success', '', 'workflows', 0, created_at, created_at, created_at, '', '', '', '',
           false, created_at
    FROM {RUNS} WHERE workflow_class IN ('older_class', 'campaign')"""


@pytest.fixture(scope="module")
def campaign(django_db_setup, django_db_blocker):
    """The older class's runs, then the campaign's, committed for the module; emptied after it."""
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute(FILL, ["older_class", "finished", "o", OLDER])
            cursor.execute(FILL, ["campaign", "ready", "c", CAMPAIGN])
            cursor.execute(STEP_FILL)
    yield
    with django_db_blocker.unblock():
        call_command("flush", verbosity=0, interactive=False)


def test_an_older_class_list_reads_its_own_runs_not_the_campaigns(admin_client, campaign):
    analyze()
    assert RUNS in HOT and CAMPAIGN > MAX_ROWS_READ  # a walk past the campaign would be caught
    for query in ("?workflow_class=older_class", "?workflow_class=older_class&status=finished"):
        url = changelist("workflowrun", query)
        response, queries = fetch(admin_client, url)

        assert_indexed(url, queries)
        shown = [run.pk for run in response.context["cl"].result_list]
        newest = WorkflowRun.objects.filter(workflow_class="older_class").order_by("-started_at", "-id")
        assert shown == list(newest.values_list("pk", flat=True)[: len(shown)]) and shown


def test_the_runs_list_without_a_class_stays_newest_first_by_id(admin_client, campaign):
    response, _queries = fetch(admin_client, changelist("workflowrun"))

    shown = [run.pk for run in response.context["cl"].result_list]
    assert shown == list(WorkflowRun.objects.order_by("-id").values_list("pk", flat=True)[: len(shown)])


def test_the_cli_and_mcp_list_of_an_older_class_reads_its_own_runs(campaign):
    analyze()
    with CaptureQueriesContext(connection) as captured:
        rows, more = list_runs(WorkflowRun.objects.all(), classes=["older_class"], statuses=["finished"], limit=20)

    assert_indexed("list_runs", captured.captured_queries)
    newest = WorkflowRun.objects.filter(workflow_class="older_class").order_by("-started_at", "-id")
    assert [run.pk for run in rows] == list(newest.values_list("pk", flat=True)[:20]) and more
