"""The server's tools as a client lists them: which, with what annotations and schemas, under which settings.

Also the two settings' defaults and their system check (E014), and the one path every call
takes: the database's errors as one line, a refused ``--as-user`` as a tool error.
"""

import psycopg
import pytest
from django.core import checks as django_checks
from django.db import connection
from django.test import override_settings

from pgbus_workflows.checks import check_settings
from pgbus_workflows.conf import settings as wf_settings
from pgbus_workflows.mcp import build_server
from pgbus_workflows.mcp.arguments import MAX_LIMIT, MAX_PAGE
from tests.mcp.session import call_all, listed_tools, text
from tests.procs import database_url
from tests.testapp.workflows import ThreeSteps

READ_TOOLS = {"list_runs", "show_run", "stuck_runs", "insights", "list_schedules"}
WRITE_TOOLS = {"pause_run", "resume_run", "cancel_run", "skip_step", "resume_at", "run_now", "signal_run"}


def test_by_default_only_the_read_tools_are_listed_each_marked_read_only():
    tools = listed_tools()
    assert set(tools) == READ_TOOLS
    for tool in tools.values():
        assert tool.annotations is not None and tool.annotations.read_only_hint is True, tool.name
        assert tool.description, tool.name


@override_settings(PGBUS_WORKFLOWS={"MCP_WRITE_TOOLS": True})
def test_with_mcp_write_tools_the_verbs_are_listed_too_not_read_only_and_cancel_and_skip_destructive():
    tools = listed_tools()
    assert set(tools) == READ_TOOLS | WRITE_TOOLS
    for name in WRITE_TOOLS:
        annotations = tools[name].annotations
        assert annotations is not None and annotations.read_only_hint is False, name
        assert annotations.destructive_hint is (name in {"cancel_run", "skip_step"}), name
        schema = tools[name].input_schema
        assert {"workflow_id", "reason"} <= set(schema["required"]), name
        assert schema["properties"]["reason"]["maxLength"] == 2000
    assert set(tools["signal_run"].input_schema["required"]) == {"workflow_id", "name", "reason"}
    assert set(tools["resume_at"].input_schema["required"]) == {"workflow_id", "step", "reason"}


@override_settings(PGBUS_WORKFLOWS={"MCP_WRITE_TOOLS": False})
def test_mcp_write_tools_false_lists_no_verb():
    assert set(listed_tools()) == READ_TOOLS


def test_the_schemas_state_the_caps_and_the_choices_and_never_ask_for_the_operator():
    tools = listed_tools()
    listing = tools["list_runs"].input_schema["properties"]
    assert (listing["limit"]["maximum"], listing["page"]["maximum"]) == (MAX_LIMIT, MAX_PAGE)
    assert listing["status"]["anyOf"][0]["items"]["enum"] == [
        "ready",
        "performing",
        "waiting",
        "paused",
        "finished",
        "cancelled",
    ]
    assert tools["insights"].input_schema["properties"]["window"]["enum"] == ["1h", "6h", "24h", "7d"]
    for tool in tools.values():
        assert not {"operator", "ctx"} & set(tool.input_schema["properties"]), tool.name


def test_the_settings_default_to_false_and_anything_but_a_boolean_fails_the_check_e014(settings):
    settings.PGBUS_WORKFLOWS = {}
    assert (wf_settings.MCP_WRITE_TOOLS, wf_settings.MCP_SHOW_PAYLOADS) == (False, False)
    assert check_settings() == []
    settings.PGBUS_WORKFLOWS = {"MCP_WRITE_TOOLS": True, "MCP_SHOW_PAYLOADS": True}
    assert check_settings() == []
    settings.PGBUS_WORKFLOWS = {"MCP_WRITE_TOOLS": "false", "MCP_SHOW_PAYLOADS": 1}
    errors = check_settings()
    assert [(e.id, e.msg) for e in errors] == [
        ("pgbus_workflows.E014", "PGBUS_WORKFLOWS['MCP_WRITE_TOOLS'] must be True or False, got 'false'."),
        ("pgbus_workflows.E014", "PGBUS_WORKFLOWS['MCP_SHOW_PAYLOADS'] must be True or False, got 1."),
    ]
    ids = [m.id for m in django_checks.run_checks(tags=[django_checks.Tags.compatibility])]
    assert ids.count("pgbus_workflows.E014") == 2


@pytest.mark.django_db
def test_the_server_is_built_anew_with_the_settings_of_its_time():
    with override_settings(PGBUS_WORKFLOWS={"MCP_WRITE_TOOLS": True}):
        writing = build_server()
    reading = build_server()
    assert "pause_run" in listed_tools(writing) and "pause_run" not in listed_tools(reading)


@pytest.mark.django_db(transaction=True)
def test_each_call_renews_a_connection_the_database_dropped_as_django_does_for_a_request():
    wf = ThreeSteps.start()
    dropped = connection.connection.info.backend_pid
    with psycopg.connect(database_url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [dropped])
    [again] = call_all([("list_runs", {})])
    assert not again.is_error, text(again)
    assert [row["workflow_id"] for row in again.structured_content["runs"]] == [str(wf.workflow_id)]
    assert connection.connection is None  # closed after the call too: CONN_MAX_AGE is 0 here
