"""Replies within ``MCP_MAX_RESPONSE_BYTES``: each answer's JSON once, its largest values cut to fit, saying so.

The cut is judged on the JSON-RPC message a client receives (:func:`wire_size` measures it as
the SDK's transport writes it), and through the SDK's client on a ``show_run`` that would take
more than the 10 MiB a stdio line may take in the MCP Inspector's SDK.
"""

import json

import pytest
from django.test import override_settings
from mcp.server.mcpserver.exceptions import ToolError

from pgbus_workflows.conf import DEFAULTS
from pgbus_workflows.mcp.fitting import ENVELOPE_BYTES, cut_marker, dumps, fitted, in_text, text_result, wire_size
from tests.management.test_cli import wid
from tests.mcp.session import answered, call
from tests.testapp.workflows import Approval

#: The most a stdio line may take in the MCP Inspector's SDK.
INSPECTOR_LINE = 10 * 1024 * 1024
#: 100 pending signals with a payload of this many characters: 12 MB of JSON.
SIGNALS, PAYLOAD_CHARACTERS = 100, 120_000
#: The settings of a run whose payloads are shown and large.
LARGE_PAYLOADS = {"MCP_SHOW_PAYLOADS": True, "MAX_PAYLOAD_SIZE": 2 * PAYLOAD_CHARACTERS}


def text_of(result) -> str:
    [block] = result.content
    return block.text


def rows(*sizes: int) -> dict:
    return {"rows": [{"id": n, "payload": {"blob": "p" * size}} for n, size in enumerate(sizes)], "page": 1}


def test_the_default_is_one_mib():
    assert DEFAULTS["MCP_MAX_RESPONSE_BYTES"] == 1024 * 1024


def test_an_answer_that_fits_is_its_json_once_unchanged():
    answer = rows(10, 20)
    result = fitted(answer, 10_000)
    assert json.loads(text_of(result)) == answer and text_of(result) == dumps(answer)
    assert result.structured_content is None


def test_the_largest_values_are_cut_first_each_replaced_by_a_marker_saying_how_big_it_was():
    answer = rows(5_000, 40_000, 20_000, 3_000)
    whole = wire_size(text_result(answer), 1)
    result = fitted(answer, whole - 30_000, 1)
    assert wire_size(result, 1) <= whole - 30_000
    cut = json.loads(text_of(result))
    payloads = [row["payload"] for row in cut["rows"]]
    assert payloads[1] == cut_marker(in_text({"blob": "p" * 40_000})) == cut_marker(40_015)
    assert payloads[1].startswith("[cut to fit PGBUS_WORKFLOWS['MCP_MAX_RESPONSE_BYTES']: 40015 bytes of JSON")
    assert [payloads[0], payloads[2], payloads[3]] == [{"blob": "p" * n} for n in (5_000, 20_000, 3_000)]
    assert [row["id"] for row in cut["rows"]] == [0, 1, 2, 3] and cut["page"] == 1

    tighter = json.loads(text_of(fitted(answer, whole - 50_000, 1)))
    assert [isinstance(row["payload"], str) for row in tighter["rows"]] == [False, True, True, False]


def test_the_size_counts_the_escaping_of_the_json_inside_the_text_and_the_envelope():
    answer = {"rows": [{"payload": '"\\' * 10_000}, {"payload": "é" * 10_000}]}
    result = text_result(answer)
    line = json.dumps(result.model_dump(by_alias=True, exclude_none=True), ensure_ascii=False, separators=(",", ":"))
    assert wire_size(result, 7) == len(line.encode()) + ENVELOPE_BYTES + len("7")
    fitting = fitted(answer, wire_size(result, 7) - 1, 7)
    assert [row["payload"] for row in json.loads(text_of(fitting))["rows"]] == [cut_marker(80_004), "é" * 10_000]


def test_an_answer_that_cannot_fit_even_cut_is_a_tool_error_asking_for_fewer_rows():
    answer = {"rows": [{"id": n, "status": "ready"} for n in range(100)]}
    with pytest.raises(ToolError, match=r"even with its values cut, more than .*\(2000\): ask for fewer rows"):
        fitted(answer, 2_000)


def pending_signals(count: int = SIGNALS, characters: int = PAYLOAD_CHARACTERS):
    """A run waiting for "approved", with ``count`` pending signals of ``characters`` characters each."""
    wf = Approval.start()
    for n in range(count):
        wf.signal("approved", {"n": n, "blob": "x" * characters}, actor="webhook")
    return wf


@pytest.mark.django_db
def test_show_run_of_a_hundred_large_signals_fits_the_cap_whole_and_valid_where_it_took_12_mb():
    with override_settings(PGBUS_WORKFLOWS=LARGE_PAYLOADS):
        wf = pending_signals()
        result = call("show_run", {"workflow_id": wid(wf), "signals": SIGNALS})
        with override_settings(PGBUS_WORKFLOWS={**LARGE_PAYLOADS, "MCP_MAX_RESPONSE_BYTES": 64 * 1024 * 1024}):
            uncut = call("show_run", {"workflow_id": wid(wf), "signals": SIGNALS})
    assert wire_size(uncut, 1) > INSPECTOR_LINE
    assert wire_size(result, 1) <= DEFAULTS["MCP_MAX_RESPONSE_BYTES"]
    page = answered(result)
    signals = page["pending_signals"]
    assert [signal["name"] for signal in signals] == ["approved"] * SIGNALS
    kept = [signal["payload"] for signal in signals if isinstance(signal["payload"], dict)]
    cut = [signal["payload"] for signal in signals if isinstance(signal["payload"], str)]
    assert 0 < len(kept) < SIGNALS and len(kept) + len(cut) == SIGNALS
    assert all(payload["blob"] == "x" * PAYLOAD_CHARACTERS for payload in kept)
    assert set(cut) <= {cut_marker(in_text({"n": n, "blob": "x" * PAYLOAD_CHARACTERS})) for n in range(SIGNALS)}
    full = answered(uncut)
    assert {**page, "pending_signals": None} == {**full, "pending_signals": None}
    assert [{**signal, "payload": None} for signal in signals] == [
        {**signal, "payload": None} for signal in full["pending_signals"]
    ]


@pytest.mark.django_db
@override_settings(PGBUS_WORKFLOWS={"MCP_MAX_RESPONSE_BYTES": 1_000})
def test_through_the_server_an_answer_too_large_even_cut_is_a_tool_error_and_the_server_goes_on():
    wf = Approval.start()
    result = call("show_run", {"workflow_id": wid(wf)})
    assert result.is_error and text_of(result).endswith("(1000): ask for fewer rows")
