"""Redaction: payloads never reach the client unless ``MCP_SHOW_PAYLOADS`` says so.

Judged on what the client receives, both the structured answer and its text: a run's
arguments, an attempt's output and error message, a signal's payload, an event's details and
the reasons an error's message is written into. A tool that forgets about redaction still
redacts: the server does it, not the tools.
"""

import json
from datetime import timedelta

import pytest
from django.test import override_settings

from pgbus_workflows import Concurrency, Debounce, RateLimit, Workflow, step
from pgbus_workflows.mcp.acting import Acting
from pgbus_workflows.mcp.responses import PLACEHOLDER, REDACTED_FIELDS, redact
from pgbus_workflows.mcp.server import READ_ONLY, Tools, offering
from pgbus_workflows.operating.operators import Operator
from pgbus_workflows.services.claims import claim_due_steps
from tests.management.test_cli import helpers, paused_on_error, wid
from tests.mcp.session import answered, call, call_all, text
from tests.testapp.models import Order
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
    return [(answered(result), text(result)) for result in results]


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
    tools = Tools()
    tools.add(careless, Acting(), READ_ONLY)
    server = offering(tools)
    result = call("careless", server=server)
    assert answered(result) == {
        "rows": [{"name": "a", "payload": PLACEHOLDER, "details": PLACEHOLDER}],
        "count": 1,
    }
    assert "s3cret-token" not in text(result) and "bob@example.com" not in text(result)
    with override_settings(PGBUS_WORKFLOWS={"MCP_SHOW_PAYLOADS": True}):
        shown = call("careless", server=server)
    assert answered(shown)["rows"][0]["payload"] == "s3cret-token"


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


# -- by what a value is built from -----------------------------------------------------------------


class KeyedCharge(Workflow):
    """Held back by a key computed from the run's arguments, and by a key the code fixes."""

    name = "mcp_keyed_charge"
    allow_multiple = True
    step_options = {"queue": "mcp_keyed"}
    concurrency = Concurrency(key=lambda wf: f"customer:{wf.arguments['email']}", limit=1)

    @step(rate_limit=RateLimit("mcp-psp", limit=1, per=timedelta(hours=1)))
    def charge(self):
        return None


class DebouncedNotice(Workflow):
    """Debounced by a key computed from the run's arguments."""

    name = "mcp_debounced_notice"
    debounce = Debounce(period=timedelta(hours=1), key=lambda wf: f"notice:{wf.arguments['email']}")

    @step
    def send(self):
        return None


class DigestNotice(Workflow):
    """Debounced by a key the code fixes."""

    name = "mcp_digest_notice"
    debounce = Debounce(period=timedelta(hours=1), key="daily-digest")

    @step
    def send(self):
        return None


class OrderNotice(Workflow):
    """Debounced by its subject (no key given)."""

    name = "mcp_order_notice"
    debounce = Debounce(period=timedelta(hours=1))

    @step
    def send(self):
        return None


def test_a_debounce_key_is_shown_when_the_code_or_the_subject_gives_it_and_hidden_when_the_arguments_do():
    order = Order.objects.create()
    computed, fixed, by_subject = (
        DebouncedNotice.start(email="bob@example.com"),
        DigestNotice.start(email="bob@example.com"),
        OrderNotice.start(order),
    )
    runs = [page["run"] for page, _text in pages(computed, fixed, by_subject)]
    assert [(run["debounce_key"], run["debounce_key_from"]) for run in runs] == [
        (PLACEHOLDER, "arguments"),
        ("daily-digest", "code"),
        (f"testapp.order:{order.pk}", "subject"),
    ]
    assert redact({"debounce_key": "notice:bob@example.com"}) == {"debounce_key": PLACEHOLDER}


def test_keys_computed_from_the_arguments_are_redacted_like_them_and_a_key_the_code_fixes_is_shown():
    KeyedCharge.start(email="bob@example.com")
    held = KeyedCharge.start(email="bob@example.com")
    assert len(claim_due_steps(10, queues=["mcp_keyed"], claimed_by="test")) == 1
    debounced = DebouncedNotice.start(email="bob@example.com")
    keyed = ThreeSteps.start(idempotency_key="order-bob@example.com")
    signalled = Approval.start()
    signalled.signal("approved", {}, idempotency_key="webhook-bob@example.com", actor="webhook")
    (held_page, held_text), (debounced_page, _), (keyed_page, _), (signal_page, signal_text) = pages(
        held, debounced, keyed, signalled
    )
    assert "bob@example.com" not in held_text + signal_text
    assert held_page["held_back"]["limits"] == [
        {"kind": "concurrency", "key": PLACEHOLDER, "limit": 1, "in_use": 1, "fixed_key": False},
        {
            "kind": "rate",
            "key": "mcp-psp",
            "limit": 1,
            "per": "P0DT01H00M00S",
            "next_token_at": held_page["held_back"]["limits"][1]["next_token_at"],
            "fixed_key": True,
        },
    ]
    assert debounced_page["run"]["debounce_key"] == PLACEHOLDER
    assert keyed_page["run"]["idempotency_key"] == PLACEHOLDER
    assert [s["idempotency_key"] for s in signal_page["pending_signals"]] == [PLACEHOLDER]
    with override_settings(PGBUS_WORKFLOWS={"MCP_SHOW_PAYLOADS": True}):
        [(shown, _)] = pages(held)
    assert shown["held_back"]["limits"][0]["key"] == "customer:bob@example.com"


@override_settings(PGBUS_WORKFLOWS={"MCP_WRITE_TOOLS": True})
def test_the_operators_actors_and_reasons_are_shown_and_an_errors_message_is_not():
    wf = ThreeSteps.start()
    failed = paused_on_error()
    results = call_all(
        [
            ("pause_run", {"workflow_id": wid(wf), "reason": "vendor outage, ticket OPS-12"}),
            ("show_run", {"workflow_id": wid(wf)}),
            ("resume_run", {"workflow_id": wid(wf), "reason": "vendor is back"}),
            ("show_run", {"workflow_id": wid(wf)}),
            ("show_run", {"workflow_id": wid(failed)}),
        ]
    )
    paused, resumed, on_error = (answered(results[n]) for n in (1, 3, 4))
    assert (paused["run"]["paused_reason"], paused["run"]["paused_by"]) == ("vendor outage, ticket OPS-12", "paused")
    assert [(e["kind"], e["actor"], e["reason"]) for e in resumed["events"] if e["kind"] in ("paused", "resumed")] == [
        ("paused", "mcp:claude-test", "vendor outage, ticket OPS-12"),
        ("resumed", "mcp:claude-test", "vendor is back"),
    ]
    assert (resumed["run"]["paused_reason"], resumed["run"]["paused_by"]) == ("", None)
    assert (on_error["run"]["paused_reason"], on_error["run"]["paused_by"]) == (PLACEHOLDER, "step_failed")
    [failure] = [e for e in on_error["events"] if e["kind"] == "step_failed"]
    assert (failure["actor"], failure["reason"]) == ("system", PLACEHOLDER)
    assert {"reason": PLACEHOLDER} == redact({"reason": "who wrote this is not said"})
