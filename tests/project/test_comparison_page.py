"""The comparison page's row for pgbus-workflows under "Workflows as code": every name it gives is there.

docs/explanation/comparison.md. What each name does is held by its own tests (tests/functions,
tests/functions/test_fork_surfaces.py, the virtual clock's in tests/faces/test_virtual_clock.py); this test fails when
the row names something renamed or removed, or a name nothing here checks.
"""

import inspect
import re
from pathlib import Path

import pytest
from django.test import override_settings

from pgbus_workflows import Workflow, durable
from pgbus_workflows.admin.runs import WorkflowRunAdmin
from pgbus_workflows.functions.context import DurableContext
from pgbus_workflows.testing import WorkflowTestMixin
from tests.mcp.session import listed_tools
from tests.project.test_docs import command_help

PAGE = Path(__file__).resolve().parents[2] / "docs" / "explanation" / "comparison.md"


def our_row() -> str:
    section = PAGE.read_text().split("## Workflows as code, forks, and time in tests", 1)[1]
    (row,) = re.findall(r"^\| pgbus-workflows \|.*$", section, re.MULTILINE)
    return row


#: Each name the row gives, and the check that it exists as the row says.
NAMES = {
    "@durable": lambda: callable(durable),
    "ctx.step": lambda: callable(DurableContext.step),
    "wf.fork(from_step=...)": lambda: "from_step" in inspect.signature(Workflow.fork).parameters,
    "manage.py workflows fork": lambda: "manage.py workflows fork" in [t for t, _ in command_help("workflows")],
    "fork_run": lambda: "fork_run" in listed_tools(),
    "resume_at(checkpoint)": lambda: callable(Workflow.resume_at),
    "advance(duration)": lambda: "duration" in inspect.signature(WorkflowTestMixin.advance).parameters,
    "WorkflowTestMixin": lambda: isinstance(WorkflowTestMixin, type),
}


@pytest.mark.django_db
@override_settings(PGBUS_WORKFLOWS={"MCP_WRITE_TOOLS": True})
def test_every_name_in_the_row_exists():
    names = re.findall(r"`([^`]+)`", our_row())
    assert sorted(names) == sorted(NAMES)
    for name in names:
        assert NAMES[name](), name


def test_the_row_names_the_admins_fork_on_one_run_and_on_a_selection():
    row = our_row()
    assert "in the admin (one run, or a selection)" in row
    assert "fork_runs" in WorkflowRunAdmin.actions
