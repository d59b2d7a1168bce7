"""``docs/mcp.md`` keeps its promises: its client configuration starts the real command, its tools are the server's."""

import ast
import json
import re
from pathlib import PurePosixPath

from django.core.management import get_commands
from django.test import override_settings

from pgbus_workflows.admin import records
from pgbus_workflows.conf import DEFAULTS
from pgbus_workflows.mcp.fitting import cut_marker, in_text
from pgbus_workflows.mcp.responses import PLACEHOLDER
from tests.mcp.session import listed_tools
from tests.procs import ROOT
from tests.support import WITHHELD

PAGE = (ROOT / "docs" / "mcp.md").read_text()


def client_configuration() -> dict:
    """The page's client configuration: its one server's entry."""
    [server] = json.loads(PAGE.split("```json\n", 1)[1].split("```", 1)[0])["mcpServers"].values()
    return server


def test_the_client_configuration_names_the_virtualenvs_python_and_manage_py_by_absolute_paths():
    server = client_configuration()
    python, manage = PurePosixPath(server["command"]), PurePosixPath(server["args"][0])
    assert python.is_absolute() and python.parts[-3:] == (".venv", "bin", "python")
    assert manage.is_absolute() and manage.name == "manage.py" and manage.parent == python.parents[2]
    assert server["args"][1:] == ["workflows_mcp"] and "cwd" not in server
    assert server["env"]["DJANGO_SETTINGS_MODULE"]
    assert get_commands()["workflows_mcp"] == "pgbus_workflows"


@override_settings(PGBUS_WORKFLOWS={"MCP_WRITE_TOOLS": True})
def test_the_page_documents_every_tool_and_every_argument_the_server_offers():
    documented = dict(re.findall(r"^### `(\w+)`\n\n(.*?)(?=^### |^## |\Z)", PAGE, re.M | re.S))
    tools = listed_tools()
    assert set(documented) == set(tools)
    for name, tool in tools.items():
        for argument in tool.input_schema["properties"]:
            assert f"`{argument}`" in documented[name], (name, argument)


def test_the_page_names_the_settings_their_defaults_the_placeholder_and_the_marker_as_they_are():
    rows = dict(re.findall(r"^\| `(MCP_\w+)` \| `([^`]+)`", PAGE, re.M))
    assert {key: ast.literal_eval(cell) for key, cell in rows.items()} == {
        key: value for key, value in DEFAULTS.items() if key.startswith("MCP_")
    }
    assert PLACEHOLDER in PAGE
    assert f"`{cut_marker(in_text({'n': 10, 'blob': 'x' * 120_000}))}`" in PAGE
    assert 'pip install "pgbus-workflows[mcp]"' in PAGE


def test_the_page_quotes_what_stands_for_an_error_text_a_user_may_not_see_as_the_server_writes_it():
    assert f'"{WITHHELD}"' in " ".join(PAGE.split())
    assert str(records.WITHHELD) == WITHHELD
