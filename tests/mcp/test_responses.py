"""Redaction: payloads never reach the client unless ``MCP_SHOW_PAYLOADS`` says so.

Judged on what the client receives, both the structured answer and its text: a run's
arguments, an attempt's output and error message, a signal's payload, an event's details and
the reasons an error's message is written into. A tool that forgets about redaction still
redacts: the server does it, not the tools.
"""

import json

import pytest
from django.test import override_settings
from mcp.server.mcpserver import MCPServer

from pgbus_workflows.management.operating import Operator
from pgbus_workflows.mcp.acting import Acting
from pgbus_workflows.mcp.responses import PLACEHOLDER, REDACTED_FIELDS, redact
from pgbus_workflows.mcp.server import READ_ONLY, add_tool
from tests.management.test_cli import helpers, paused_on_error, wid
from tests.mcp.session import call, call_all, text
from tests.testapp.workflows import Approval, ThreeSteps

pytestmark = pytest.mark.django_db

SECRETS = ("bob@example.com", "the first attempt fails", "s3cret-token")


def runs_with_payloads():
    """A run with arguments and an output, one paused on an error, one with a pending signal's payload."""
    with_output = ThreeSteps.start(email="bob@example.com")
    helpers.perform_next_step(with_output)
    failed = paused_on_error()
    signalled = Approval.start()
    signalled.signal("approved", {"token": "s3cret-token"}, actor="webhook")
    return with_output, failed, signalled


def pages(*runs):
    """What the client receives for each run's show_run: (structured answer, text)."""
    results = call_all([("show_run", {"workflow_id": wid(wf)}) for wf in runs])
    assert not any(result.is_error for result in results), [text(result) for result in results]
    return [(result.structured_content, text(result)) for result in results]


def test_by_default_arguments_outputs_errors_payloads_and_details_are_redacted():
    with_output, failed, signalled = runs_with_payloads()
    (output_page, output_text), (failed_page, failed_text), (signal_page, signal_text) = pages(
        with_output, failed, signalled
    )
    for page, shown in ((output_page, output_text), (failed_page, failed_text), (signal_page, signal_text)):
        for secret in SECRETS:
            assert secret not in json.dumps(page) and secret not in shown, secret

    assert output_page["run"]["arguments"] == PLACEHOLDER
    assert [(a["step_name"], a["output"]) for a in output_page["attempts"]] == [("one", PLACEHOLDER), ("two", None)]
    assert failed_page["attempts"][0]["error_message"] == PLACEHOLDER
    assert failed_page["attempts"][0]["error_class"] == "RuntimeError"  # what failed, not what it said
    assert failed_page["run"]["paused_reason"] == PLACEHOLDER
    failure = next(e for e in failed_page["events"] if e["kind"] == "step_failed")
    assert (failure["reason"], failure["details"]) == (PLACEHOLDER, PLACEHOLDER)
    assert [(s["name"], s["payload"]) for s in signal_page["pending_signals"]] == [("approved", PLACEHOLDER)]
    assert PLACEHOLDER == "[redacted: set PGBUS_WORKFLOWS['MCP_SHOW_PAYLOADS'] = True to show]"


def test_empty_values_are_shown_as_empty_so_nothing_looks_hidden():
    wf = ThreeSteps.start()
    helpers.perform_next_step(wf)
    [(page, _text)] = pages(wf)
    assert page["run"]["arguments"] == {}
    assert page["run"]["paused_reason"] == ""
    assert [(a["output"], a["error_message"]) for a in page["attempts"]] == [(PLACEHOLDER, ""), (None, "")]


@override_settings(PGBUS_WORKFLOWS={"MCP_SHOW_PAYLOADS": True})
def test_with_mcp_show_payloads_everything_is_shown():
    with_output, failed, signalled = runs_with_payloads()
    (output_page, _), (failed_page, _), (signal_page, _) = pages(with_output, failed, signalled)
    assert output_page["run"]["arguments"] == {"email": "bob@example.com"}
    assert output_page["attempts"][0]["output"] == {"n": 1}
    assert failed_page["attempts"][0]["error_message"] == "the first attempt fails"
    assert failed_page["run"]["paused_reason"] == "RuntimeError: the first attempt fails"
    failure = next(e for e in failed_page["events"] if e["kind"] == "step_failed")
    assert failure["reason"] == "RuntimeError: the first attempt fails"
    assert failure["details"]["action"] == "pause"
    assert [s["payload"] for s in signal_page["pending_signals"]] == [{"token": "s3cret-token"}]


def careless(operator: Operator) -> dict:
    """A tool that returns payloads and does nothing about them."""
    return {"rows": [{"name": "a", "payload": "s3cret-token", "details": {"deep": "bob@example.com"}}], "count": 1}


def test_a_tool_that_forgets_about_payloads_still_has_them_redacted():
    server = MCPServer("test")
    add_tool(server, careless, Acting(), READ_ONLY)
    result = call("careless", server=server)
    assert result.structured_content == {
        "rows": [{"name": "a", "payload": PLACEHOLDER, "details": PLACEHOLDER}],
        "count": 1,
    }
    assert "s3cret-token" not in text(result) and "bob@example.com" not in text(result)
    with override_settings(PGBUS_WORKFLOWS={"MCP_SHOW_PAYLOADS": True}):
        shown = call("careless", server=server)
    assert shown.structured_content["rows"][0]["payload"] == "s3cret-token"


def test_redact_finds_the_fields_at_any_depth_and_leaves_the_rest():
    value = {
        "run": {"arguments": {"a": 1}, "status": "ready"},
        "events": [{"kind": "x", "details": [1], "reason": None}, {"output": 0}],
        "kept": ["payload", {"nested": {"error_message": "boom"}}],
    }
    assert redact(value) == {
        "run": {"arguments": PLACEHOLDER, "status": "ready"},
        "events": [{"kind": "x", "details": PLACEHOLDER, "reason": None}, {"output": PLACEHOLDER}],
        "kept": ["payload", {"nested": {"error_message": PLACEHOLDER}}],
    }
    assert {"arguments", "output", "error_message", "payload", "details"} <= REDACTED_FIELDS
