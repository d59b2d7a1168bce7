"""The upstream task tests that do not apply (``tests/upstream/run.py``, ``tests/upstream/vendored.py``) are the
ones ``docs/tasks.md`` lists, and the counts it gives of the vendored suites are theirs."""

import ast
import re
from pathlib import Path

import pytest

from tests.procs import ROOT
from tests.upstream.run import NOT_APPLICABLE
from tests.upstream.vendored import SUITES

DOCS = (ROOT / "docs" / "tasks.md").read_text()

#: Each runner's list, by the heading of its section in docs/tasks.md.
LISTS = {
    "### Django's own": NOT_APPLICABLE,
    "### The django-tasks backport's": SUITES["backport"].not_applicable,
    "### django-tasks-db's": SUITES["tasks_db"].not_applicable,
}


def section(heading: str) -> str:
    start = DOCS.index(f"\n{heading}\n")
    end = DOCS.find("\n#", start + len(heading) + 2)
    return DOCS[start : end if end != -1 else None]


def named_in_table(text: str) -> set[str]:
    """The tests and classes the table's first column names (``Class.test_x``, ``test_x``, ``Class``), last part."""
    cells = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    return {name.rsplit(".", 1)[-1] for cell in cells for name in re.findall(r"`([\w.]+)`", cell)}


@pytest.mark.parametrize("heading", LISTS)
def test_every_skipped_upstream_test_is_named_in_the_docs(heading):
    assert named_in_table(section(heading)) == {test_id.rsplit(".", 1)[1] for test_id in LISTS[heading]}


def test_djangos_skipped_tests_are_named_with_their_module_and_class():
    for test_id in NOT_APPLICABLE:
        module, cls, _method = test_id.rsplit(".", 2)
        assert module.startswith("tasks.test_") and cls.endswith("TestCase")


def vendored_tests(folder: Path) -> dict[str, list[str]]:
    """Each test class of the suite's test modules (``tests.tests...Class``): its tests' names."""
    modules = sorted(folder.glob("tests/tests/test_*.py")) or [folder / "tests" / "tests.py"]
    classes = {}
    for path in modules:
        module = ".".join(path.relative_to(folder).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("TestCase"):
                methods = (ast.FunctionDef, ast.AsyncFunctionDef)
                tests = [item.name for item in node.body if isinstance(item, methods) and item.name.startswith("test_")]
                classes[f"{module}.{node.name}"] = tests
    return classes


@pytest.mark.parametrize(
    ("heading", "name"), [("### The django-tasks backport's", "backport"), ("### django-tasks-db's", "tasks_db")]
)
def test_the_docs_count_the_vendored_tests_that_pass(heading, name):
    classes = vendored_tests(SUITES[name].folder)
    every = {f"{cls}.{test}" for cls, tests in classes.items() for test in tests}
    skipped = set()
    for test_id in SUITES[name].not_applicable:
        skipped |= {f"{test_id}.{test}" for test in classes[test_id]} if test_id in classes else {test_id}
    assert skipped <= every
    assert f" {len(every) - len(skipped)} of the {len(every)} tests pass" in " ".join(section(heading).split())
