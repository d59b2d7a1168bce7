"""Every branch on the database vendor is in the map's table of what SQLite lacks (``docs/architecture.md``).

A function asks which database it runs on when it calls ``sql.postgresql()``, reads a
connection's ``vendor`` or is an ``as_sqlite`` method. The section "What SQLite lacks" lists
each such function, by module, with what SQLite lacks there or does instead: a new branch
without its row fails here, and so does a row whose function no longer asks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGE = REPOSITORY / "pgbus_workflows"
PAGE = REPOSITORY / "docs" / "architecture.md"
HEADING = "## What SQLite lacks"


def _asks(node: ast.AST) -> bool:
    """Whether ``node`` is a call of ``postgresql()`` or a read of a ``vendor`` attribute."""
    if isinstance(node, ast.Call):
        called = node.func
        name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", None)
        return name == "postgresql"
    return isinstance(node, ast.Attribute) and node.attr == "vendor"


def _askers(node: ast.AST, scope: list[str]) -> Iterator[str]:
    """The qualified names of the functions under ``node`` that ask the vendor (``<module>``: its top level)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = [*scope, child.name]
            if not isinstance(child, ast.ClassDef) and child.name.startswith("as_sqlite"):
                yield ".".join(inner)
            yield from _askers(child, inner)
            continue
        if _asks(child):
            yield ".".join(scope) or "<module>"
        yield from _askers(child, scope)


def vendor_branches() -> set[tuple[str, str]]:
    """``(module under the package, function)`` of every function of the package that asks the vendor."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        if "migrations" in relative.parts:
            continue
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        module = ".".join(parts) or "<package>"
        found |= {(module, function) for function in _askers(ast.parse(path.read_text()), [])}
    return found


def mapped_branches() -> set[tuple[str, str]]:
    """``(module, function)`` of every row of the map's table of what SQLite lacks."""
    section = PAGE.read_text().split(HEADING + "\n", 1)[1].split("\n## ", 1)[0]
    found = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        module = cells[0].strip("`")
        found |= {(module, function) for function in re.findall(r"`([^`]+)`", cells[1])}
    return found


def test_the_scan_finds_the_branches_it_must():
    branches = vendor_branches()
    # One of each kind: a call of sql.postgresql(), a connection's vendor, an as_sqlite method.
    assert ("services.claims", "_claim_due") in branches
    assert ("sql.replica", "read_lag") in branches
    assert ("admin.limiters", "NaturalName.as_sqlite") in branches


def test_every_vendor_branch_is_in_the_map_and_every_row_is_a_branch():
    branches, mapped = vendor_branches(), mapped_branches()

    assert not branches - mapped, f"add to {HEADING!r} in docs/architecture.md: {sorted(branches - mapped)}"
    assert not mapped - branches, f"remove from {HEADING!r} in docs/architecture.md: {sorted(mapped - branches)}"
