"""``docs/mcp.md`` keeps its promises: its client configuration starts the real command, its tools are the server's."""

import json
import re

from django.core.management import get_commands
from django.test import override_settings

from pgbus_workflows.conf import DEFAULTS
from pgbus_workflows.mcp.responses import PLACEHOLDER
from tests.mcp.session import listed_tools
from tests.procs import ROOT

PAGE = (ROOT / "docs" / "mcp.md").read_text()


def test_the_client_configuration_parses_and_starts_manage_py_workflows_mcp():
    configuration = json.loads(PAGE.split("```json\n", 1)[1].split("```", 1)[0])
    [server] = configuration["mcpServers"].values()
    assert (server["command"], server["args"]) == ("python", ["manage.py", "workflows_mcp"])
    assert server["cwd"] and server["env"]["DJANGO_SETTINGS_MODULE"]
    assert get_commands()["workflows_mcp"] == "pgbus_workflows"


@override_settings(PGBUS_WORKFLOWS={"MCP_WRITE_TOOLS": True})
def test_the_page_documents_every_tool_and_every_argument_the_server_offers():
    documented = dict(re.findall(r"^### `(\w+)`\n\n(.*?)(?=^### |^## |\Z)", PAGE, re.M | re.S))
    tools = listed_tools()
    assert set(documented) == set(tools)
    for name, tool in tools.items():
        for argument in tool.input_schema["properties"]:
            assert f"`{argument}`" in documented[name], (name, argument)


def test_the_page_names_the_settings_and_the_placeholder_as_they_are():
    for key in ("MCP_WRITE_TOOLS", "MCP_SHOW_PAYLOADS"):
        assert key in DEFAULTS and f"`{key}`" in PAGE
    assert PLACEHOLDER in PAGE
    assert 'pip install "pgbus-workflows[mcp]"' in PAGE
