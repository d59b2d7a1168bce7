"""The server's tools as a client lists them: which, with what annotations and schemas, under which settings.

Also the two settings' defaults and their system check (E014), and the one path every call
takes: the database's errors as one line, a refused ``--as-user`` as a tool error.
"""

import json
from typing import Any

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.core import checks as django_checks
from django.db import connection
from django.test import override_settings
from mcp.client import Client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.types import ServerCapabilities

from pgbus_workflows.checks import check_settings
from pgbus_workflows.conf import settings as wf_settings
from pgbus_workflows.mcp import build_server
from pgbus_workflows.mcp.acting import Acting
from pgbus_workflows.mcp.arguments import MAX_LIMIT, MAX_PAGE
from pgbus_workflows.mcp.server import READ_ONLY, Tools, offering
from pgbus_workflows.operating.operators import Operator
from tests.mcp.session import answered, call_all, listed_tools, text
from tests.procs import database_url
from tests.testapp.workflows import ThreeSteps

READ_TOOLS = {"health", "list_runs", "show_run", "stuck_runs", "insights", "list_schedules", "limits"}
WRITE_TOOLS = {
    "pause_run",
    "resume_run",
    "cancel_run",
    "skip_step",
    "resume_at",
    "run_now",
    "signal_run",
    "hold",
    "release",
    "fork_run",
}


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
        run_verb = name not in {"hold", "release"}  # those name a class or a queue
        assert ({"workflow_id", "reason"} if run_verb else {"reason"}) <= set(schema["required"]), name
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
    assert [row["workflow_id"] for row in answered(again)["runs"]] == [str(wf.workflow_id)]
    assert connection.connection is None  # closed after the call too: CONN_MAX_AGE is 0 here


async def _declared(server: Server[Any]) -> tuple[ServerCapabilities, list[str]]:
    async with Client(server) as session:
        refused = []
        for listing in (session.list_resources, session.list_prompts):
            try:
                await listing()
            except MCPError as error:
                refused.append(error.error.message)
        return session.server_capabilities, refused


@override_settings(PGBUS_WORKFLOWS={"MCP_WRITE_TOOLS": True})
def test_the_server_declares_the_tools_capability_and_none_it_would_leave_empty():
    capabilities, refused = async_to_sync(_declared)(build_server())
    assert capabilities.tools is not None
    assert (capabilities.resources, capabilities.prompts, capabilities.completions, capabilities.logging) == (
        None,
        None,
        None,
        None,
    )
    assert refused == ["Method not found", "Method not found"]


@pytest.mark.django_db
def test_each_answer_is_sent_once_as_compact_json_text_and_no_tool_declares_an_output_schema():
    ThreeSteps.start()
    assert all(tool.output_schema is None for tool in listed_tools().values())
    [result] = call_all([("list_runs", {})])
    assert result.structured_content is None
    [block] = result.content
    assert block.type == "text" and json.loads(block.text)["runs"][0]["workflow_class"] == "three_steps"
    assert block.text == json.dumps(json.loads(block.text), ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("value", [0, -1, "1MiB", 1.5, True])
def test_mcp_max_response_bytes_must_be_a_positive_integer_e006(settings, value):
    settings.PGBUS_WORKFLOWS = {"MCP_MAX_RESPONSE_BYTES": value}
    assert [(e.id, e.msg) for e in check_settings()] == [
        (
            "pgbus_workflows.E006",
            f"PGBUS_WORKFLOWS['MCP_MAX_RESPONSE_BYTES'] must be a positive integer, got {value!r}.",
        )
    ]
    settings.PGBUS_WORKFLOWS = {"MCP_MAX_RESPONSE_BYTES": 4096}
    assert check_settings() == [] and wf_settings.MCP_MAX_RESPONSE_BYTES == 4096


def broken(operator: Operator) -> dict:
    """A tool whose body fails unexpectedly, its message quoting data."""
    raise RuntimeError("bob@example.com")


def test_an_unexpected_exception_is_a_tool_error_that_quotes_nothing_and_the_server_goes_on(caplog):
    tools = Tools()
    tools.add(broken, Acting(), READ_ONLY)
    failed, again = call_all([("broken", {}), ("broken", {})], server=offering(tools))
    assert (failed.is_error, text(failed)) == (True, "Error executing tool broken")
    assert again.is_error
    assert "Tool 'broken' raised an unexpected exception" in caplog.text
