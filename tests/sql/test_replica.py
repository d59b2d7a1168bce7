"""``READ_DATABASE`` in one process: which reads go to it, which stay on the primary, and its lag shown.

The ``replica`` alias of the test settings is a test mirror of ``default``: the same database
through a connection of its own, so each test commits (``transaction=True``) and counts, per
connection, the statements that went where. The lag of a real standby, paused and resumed, is
in ``test_replica_processes.py``.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pgbus_workflows.models import WorkflowRun, WorkflowStep
from pgbus_workflows.models.reading import read_alias, reading
from pgbus_workflows.services.health import check_health
from pgbus_workflows.sql import clock
from pgbus_workflows.sql.counting import (
    bounded_pair_counts,
    distinct_values,
    estimated_count,
    oldest_due_at,
    planner_estimate,
)
from pgbus_workflows.sql.replica import ReadLag, read_lag
from tests.exposition import samples
from tests.mcp.session import answer
from tests.testapp.workflows import ThreeSteps

BOTH = ["default", "replica"]
on_replica = override_settings(PGBUS_WORKFLOWS={"READ_DATABASE": "replica"})


def statements(reads: CaptureQueriesContext) -> list[str]:
    """The statements a connection ran while ``reads`` watched it."""
    return [query["sql"] for query in reads.captured_queries]


def test_read_database_names_an_alias_of_databases():
    for bad in ("nope", 1, None):
        with override_settings(PGBUS_WORKFLOWS={"READ_DATABASE": bad}):
            errors = [e for e in run_checks() if e.id == "pgbus_workflows.E017"]
        assert len(errors) == 1
        assert errors[0].msg == (
            f"PGBUS_WORKFLOWS['READ_DATABASE'] must be an alias of DATABASES ('default', 'replica'), got {bad!r}."
        )
    with on_replica:
        assert not [e for e in run_checks() if e.id == "pgbus_workflows.E017"]


def test_reading_sends_the_reads_there_and_the_writes_and_locks_to_the_primary():
    assert read_alias() == "default" and WorkflowRun.objects.all().db == "default"
    with on_replica, reading() as alias:
        assert alias == read_alias() == "replica"
        assert WorkflowRun.objects.filter(status="ready").db == "replica"
        assert WorkflowStep.objects.all().db == "replica"
        assert WorkflowRun.objects.select_for_update().db == "default"
        assert WorkflowRun.objects.using("default").db == "default"
        with reading("default"):
            assert WorkflowRun.objects.all().db == "default"
        assert WorkflowRun.objects.all().db == "replica"
    assert WorkflowRun.objects.all().db == "default"


@pytest.mark.django_db(databases=BOTH)
def test_the_lag_is_zero_on_the_primary_and_on_a_server_not_in_recovery():
    assert read_lag("default") == ReadLag("default", standby=False, seconds=0.0)
    assert not read_lag("default").elsewhere
    mirrored = read_lag("replica")
    assert mirrored == ReadLag("replica", standby=False, seconds=0.0)
    assert mirrored.sentence() == "read from 'replica', not behind the primary"
    assert ReadLag("replica", True, 2.25).sentence() == "read from 'replica', 2.2 s behind the primary"
    assert ReadLag("replica", True, None).as_dict() == {"database": "replica", "standby": True, "lag_seconds": None}


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_the_admins_lists_dashboard_and_insights_read_the_replica_and_say_so(admin_client):
    ThreeSteps.start()
    lists = ["workflowrun", "workflowstep", "workflowevent", "workflowsignal", "fanoutjob", "workflowlimiter"]
    pages = [
        *(reverse(f"admin:pgbus_workflows_{name}_changelist") for name in lists),
        reverse("admin:pgbus_workflows_workflowrun_dashboard"),
        reverse("admin:pgbus_workflows_insights", args=["three_steps"]),
    ]
    for page in pages:
        with on_replica, CaptureQueriesContext(connections["replica"]) as replica:
            html = admin_client.get(page).content.decode()
        assert "Rows read from &#x27;replica&#x27;, not behind the primary." in html, page
        assert any("pgbus_workflows_" in sql for sql in statements(replica)), page
        # With the primary as READ_DATABASE (the default), nothing says where the rows came from.
        assert "read-lag" not in admin_client.get(page).content.decode()


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_an_admin_action_and_the_run_page_read_the_primary(admin_client):
    wf = ThreeSteps.start()
    url = reverse("admin:pgbus_workflows_workflowrun_changelist")
    form = {"action": "pause_runs", "index": "0", ACTION_CHECKBOX_NAME: [wf.record.pk], "post": "yes", "reason": "held"}
    with on_replica, CaptureQueriesContext(connections["replica"]) as replica:
        admin_client.post(url, form)
        admin_client.get(reverse("admin:pgbus_workflows_workflowrun_change", args=[wf.record.pk]))
    assert statements(replica) == []
    assert WorkflowRun.objects.get(pk=wf.record.pk).status == "paused"


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_the_clis_list_reads_the_replica_with_the_lag_under_its_table():
    wf = ThreeSteps.start()
    out = StringIO()
    with on_replica, CaptureQueriesContext(connections["replica"]) as replica:
        call_command("workflows", "list", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "Rows read from 'replica', not behind the primary."
    assert str(wf.workflow_id) in out.getvalue()
    assert any("pgbus_workflows_workflowrun" in sql for sql in statements(replica))
    with on_replica:
        call_command("workflows", "list", "--json", stdout=(plain := StringIO()))
        call_command("workflows", "list", "--ids", stdout=(ids := StringIO()))
    assert [row["workflow_id"] for row in json.loads(plain.getvalue())] == [str(wf.workflow_id)]
    assert ids.getvalue() == f"{wf.workflow_id}\n"


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_the_clis_show_reads_the_primary():
    wf = ThreeSteps.start()
    with on_replica, CaptureQueriesContext(connections["replica"]) as replica:
        call_command("workflows", "show", str(wf.workflow_id), stdout=(out := StringIO()))
    assert str(wf.workflow_id) in out.getvalue() and "read from" not in out.getvalue()
    assert statements(replica) == []


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_health_reads_the_primary_and_reports_the_read_databases_lag():
    ThreeSteps.start()
    with on_replica, CaptureQueriesContext(connections["replica"]) as replica, reading():
        health = check_health()
    assert [sql for sql in statements(replica) if "pgbus_workflows_" in sql] == []
    assert health.read_database == {"database": "replica", "standby": False, "lag_seconds": 0.0}
    assert not [note for note in health.notes if "read database" in note]
    assert check_health().read_database is None


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_the_mcp_list_tools_read_the_replica_and_give_its_lag_and_show_run_reads_the_primary():
    wf = ThreeSteps.start()
    with on_replica, CaptureQueriesContext(connections["replica"]) as replica:
        listed = answer("list_runs")
    assert listed["read_database"] == {"database": "replica", "standby": False, "lag_seconds": 0.0}
    assert [row["workflow_id"] for row in listed["runs"]] == [str(wf.workflow_id)]
    assert any("pgbus_workflows_workflowrun" in sql for sql in statements(replica))
    others = [("stuck_runs", {}), ("insights", {"workflow_class": "three_steps"}), ("list_schedules", {})]
    for tool, arguments in others:
        with on_replica:
            assert answer(tool, arguments)["read_database"]["database"] == "replica", tool
    with on_replica, CaptureQueriesContext(connections["replica"]) as replica:
        page = answer("show_run", {"workflow_id": str(wf.workflow_id)})
        health = answer("health")
    assert health["read_database"]["database"] == "replica"
    assert "read_database" not in page
    assert [sql for sql in statements(replica) if "pgbus_workflows_" in sql] == []  # health's lag is read there
    assert "read_database" not in answer("list_runs")


@pytest.mark.django_db(transaction=True, databases=BOTH)
@override_settings(ROOT_URLCONF="tests.metrics_urls")
def test_a_metrics_scrape_counts_on_the_replica_and_gives_its_lag(client):
    ThreeSteps.start()
    with on_replica, CaptureQueriesContext(connections["replica"]) as replica:
        table = samples(client.get("/metrics/").content.decode())
    assert table[("pgbus_workflows_read_lag_seconds", ())] == 0.0
    assert any("pgbus_workflows_workflowrun" in sql for sql in statements(replica))
    assert not any("pgbus_workflows_dispatcher" in sql for sql in statements(replica))  # liveness: the primary
    assert ("pgbus_workflows_read_lag_seconds", ()) not in samples(client.get("/metrics/").content.decode())


@pytest.mark.django_db(transaction=True, databases=BOTH)
def test_the_counts_without_a_scan_read_the_same_alias_as_the_querysets():
    ThreeSteps.start()
    with on_replica, reading(), CaptureQueriesContext(connections["replica"]) as replica:
        assert planner_estimate(WorkflowRun.objects.filter(status="ready")) >= 1
        assert estimated_count(WorkflowRun.objects.all(), exact_up_to=0) >= (1, True)
        assert distinct_values(WorkflowRun, "workflow_class") == ["three_steps"]
        assert bounded_pair_counts(WorkflowRun, (["three_steps"], ["ready"]), 10) == {("three_steps", "ready"): 1}
        assert oldest_due_at(clock.now()) is not None
    ran = statements(replica)
    assert len([sql for sql in ran if sql.startswith("EXPLAIN")]) == 2
    assert len([sql for sql in ran if "pgbus_workflows_" in sql]) == 6
