"""``python manage.py workflows_mcp`` in a process of its own, driven by the SDK's own stdio client.

As an assistant's client starts it: the tools listed, answered and recorded, bad calls that
leave the server serving, a database not migrated or out of reach, ``--as-user`` checked at
start, and the extra missing. Each call waits for its answer; nothing waits on a timer.
"""

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import PurePosixPath
from typing import Any

import anyio
import pytest
from django.test import override_settings
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult, Implementation

from pgbus_workflows.conf import DEFAULTS
from tests.management.test_cli import wid
from tests.mcp.session import answered
from tests.mcp.test_docs import client_configuration
from tests.mcp.test_fitting import INSPECTOR_LINE, LARGE_PAYLOADS, SIGNALS, pending_signals
from tests.mcp.test_server import READ_TOOLS, WRITE_TOOLS
from tests.procs import ROOT, database_url
from tests.services.test_deploy_processes import empty_database  # noqa: F401 (a fixture)
from tests.support import VIEW, events_of, staff_user
from tests.testapp.workflows import ThreeSteps

pytestmark = pytest.mark.processes

#: How long one answer may take before the test fails (a process's start included).
ANSWER_TIMEOUT = 60


def server_parameters(*args: str, url: str | None = None, settings: dict[str, Any] | None = None):
    """The command as an MCP client's configuration starts it, on the test database."""
    return StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "workflows_mcp", *args],
        cwd=ROOT,
        env={
            "DATABASE_URL": url or database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PGBUS_WORKFLOWS_JSON": json.dumps(settings or {}),
        },
    )


def session(
    parameters: StdioServerParameters, calls: list[tuple[str, dict[str, Any]]], client: str = "stdio-test"
) -> tuple[set[str], list[CallToolResult], str]:
    """Start the server, list its tools, make ``calls`` in turn: (tool names, results, the server's stderr)."""

    async def run(errors) -> tuple[set[str], list[CallToolResult]]:
        transport = stdio_client(parameters, errlog=errors)
        info = Implementation(name=client, version="1.0")
        async with Client(transport, client_info=info, read_timeout_seconds=ANSWER_TIMEOUT) as connected:
            names = {tool.name for tool in (await connected.list_tools()).tools}
            return names, [await connected.call_tool(name, arguments) for name, arguments in calls]

    with tempfile.TemporaryFile("w+") as errors:
        names, results = anyio.run(run, errors)
        errors.seek(0)
        return names, results, errors.read()


def text(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


@pytest.mark.django_db(transaction=True)
def test_the_command_serves_the_tools_records_the_client_and_survives_bad_calls():
    wf = ThreeSteps.start()
    names, results, stderr = session(
        server_parameters(settings={"MCP_WRITE_TOOLS": True}),
        [
            ("show_run", {"workflow_id": "0" * 32}),
            ("list_runs", {"limit": 1000}),
            ("pause_run", {"workflow_id": wid(wf)}),
            ("resume_run", {"workflow_id": wid(wf), "reason": "not paused yet"}),
            ("pause_run", {"workflow_id": wid(wf), "reason": "checking the vendor's outage"}),
            ("list_runs", {"status": ["paused"]}),
        ],
    )
    assert names == READ_TOOLS | WRITE_TOOLS, stderr
    assert [result.is_error for result in results] == [True, True, True, True, False, False], stderr
    assert text(results[0]) == f"Error executing tool show_run: No workflow run {'0' * 32}"
    assert "Input should be less than or equal to 100" in text(results[1])
    assert "reason\n  Field required" in text(results[2])
    assert text(results[3]).endswith("refused: Cannot resume a ready workflow: it is not paused")
    assert answered(results[4])["status"] == "paused"
    assert [row["workflow_id"] for row in answered(results[5])["runs"]] == [wid(wf)]
    assert [(e.actor, e.reason) for e in events_of(wf, "paused")] == [
        ("mcp:stdio-test", "checking the vendor's outage")
    ]


@pytest.mark.django_db(transaction=True)
def test_as_user_is_checked_at_start_and_on_each_call(django_user_model):
    staff_user(django_user_model, "vera", *VIEW)
    wf = ThreeSteps.start()
    names, results, stderr = session(
        server_parameters("--as-user", "vera", settings={"MCP_WRITE_TOOLS": True}),
        [("list_runs", {}), ("pause_run", {"workflow_id": wid(wf), "reason": "looks odd"})],
    )
    assert "pause_run" in names, stderr
    assert [row["workflow_id"] for row in answered(results[0])["runs"]] == [wid(wf)]
    assert results[1].is_error and "vera may not pause it" in text(results[1])
    assert wf.reload().status == "ready"

    parameters = server_parameters("--as-user", "ghost")
    ended = subprocess.run(
        [parameters.command, *parameters.args],
        cwd=ROOT,
        env={**os.environ, **(parameters.env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=ANSWER_TIMEOUT,
        check=False,
    )
    assert (ended.returncode, ended.stdout) == (1, "")
    assert ended.stderr == "CommandError: --as-user: there is no user 'ghost'\n"


def test_a_database_not_migrated_or_out_of_reach_is_a_tool_error_of_one_line(empty_database):  # noqa: F811
    _names, [unmigrated, again], stderr = session(
        server_parameters(url=empty_database), [("list_runs", {}), ("show_run", {"workflow_id": "0" * 32})]
    )
    for result in (unmigrated, again):
        assert result.is_error, stderr
        message = text(result).split(": ", 1)[1]
        assert message.startswith("The database lacks pgbus_workflows migrations (pgbus_workflows.0001_initial")
        assert message.endswith("run `python manage.py migrate`") and "\n" not in message

    closed = "postgres://root@127.0.0.1:1/nothing"  # port 1: nothing listens there
    _names, [down], stderr = session(server_parameters(url=closed), [("list_runs", {})])
    assert down.is_error, stderr
    assert text(down).startswith("Error executing tool list_runs: Cannot use the database: ")
    assert "\n" not in text(down) and "Traceback" not in text(down)


def test_without_the_sdk_the_command_says_which_extra_to_install():
    script = (
        "import sys; sys.modules['mcp'] = None\n"  # as if the SDK were not installed
        "from django.core.management import execute_from_command_line\n"
        "execute_from_command_line(['manage.py', 'workflows_mcp'])\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=ANSWER_TIMEOUT,
        check=False,
    )
    assert (ended.returncode, ended.stdout) == (1, "")
    assert ended.stderr == 'CommandError: The MCP tools need the MCP SDK: pip install "pgbus-workflows[mcp]"\n'


def exchange(parameters: StdioServerParameters, requests: list[dict[str, Any]]) -> list[bytes]:
    """Start the server and write ``requests`` as JSON-RPC lines: the line answering each one that has an id."""
    server = subprocess.Popen(
        [parameters.command, *parameters.args],
        cwd=ROOT,
        env={**os.environ, **(parameters.env or {})},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert server.stdin is not None and server.stdout is not None
    lines = []
    try:
        for request in requests:
            server.stdin.write(json.dumps(request).encode() + b"\n")
            server.stdin.flush()
            if "id" in request:
                ready, _, _ = select.select([server.stdout], [], [], ANSWER_TIMEOUT)
                assert ready, f"no answer to {request['method']} within {ANSWER_TIMEOUT} s"
                lines.append(server.stdout.readline())
    finally:
        server.stdin.close()
        server.wait(timeout=ANSWER_TIMEOUT)
    return lines


@pytest.mark.django_db(transaction=True)
def test_a_show_run_of_12_mb_comes_as_one_line_within_the_cap_and_the_sdk_client_reads_it_whole():
    with override_settings(PGBUS_WORKFLOWS=LARGE_PAYLOADS):
        wf = pending_signals()
    show = {"workflow_id": wid(wf), "signals": SIGNALS}
    parameters = server_parameters(settings=LARGE_PAYLOADS)
    initialized, line = exchange(
        parameters,
        [
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            },
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "show_run", "arguments": show}},
        ],
    )
    assert set(json.loads(initialized)["result"]["capabilities"]) == {"tools"}
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    assert len(line) <= DEFAULTS["MCP_MAX_RESPONSE_BYTES"] < INSPECTOR_LINE
    message = json.loads(line)
    assert (message["id"], set(message["result"])) == (2, {"content", "isError"})
    [block] = message["result"]["content"]
    page = json.loads(block["text"])
    assert len(page["pending_signals"]) == SIGNALS
    assert any(isinstance(signal["payload"], str) for signal in page["pending_signals"])

    _names, [result], stderr = session(parameters, [("show_run", show)])
    page = answered(result)
    assert [signal["payload"]["n"] for signal in page["pending_signals"] if isinstance(signal["payload"], dict)]
    assert all(
        signal["payload"].startswith("[cut to fit PGBUS_WORKFLOWS['MCP_MAX_RESPONSE_BYTES']: ")
        for signal in page["pending_signals"]
        if isinstance(signal["payload"], str)
    ), stderr


@pytest.mark.django_db(transaction=True)
def test_the_documented_client_configuration_starts_the_server_from_any_folder():
    documented = client_configuration()
    folder = str(PurePosixPath(documented["command"]).parents[2])
    wf = ThreeSteps.start()
    with tempfile.TemporaryDirectory() as elsewhere:
        parameters = StdioServerParameters(
            command=sys.executable,
            args=[documented["args"][0].replace(folder, str(ROOT)), *documented["args"][1:]],
            cwd=elsewhere,
            env={"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": database_url()},
        )
        names, [listed], stderr = session(parameters, [("list_runs", {})])
    assert names == READ_TOOLS, stderr
    assert [row["workflow_id"] for row in answered(listed)["runs"]] == [wid(wf)]
