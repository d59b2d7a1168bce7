"""The module map of ``docs/architecture.md`` names every module of the package, as the code says.

The section "Every module" lists each module (each folder's ``__init__`` included, the
migrations left out) under the floor of the import-linter layers contract (``pyproject.toml``)
it stands on, top floor first, with its docstring's summary. A module added, moved,
removed or described anew without the map changing fails here; the section is written by
``python -m tests.project.test_module_map``, which prints it.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGE = REPOSITORY / "pgbus_workflows"
PAGE = REPOSITORY / "docs" / "architecture.md"
HEADING = "## Every module"


def floors() -> list[list[str]]:
    """The layers contract's floors, top first: each the dotted names of the modules and folders on it."""
    config = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [[name.strip() for name in floor.split(":")] for floor in contract["layers"]]


def modules() -> dict[str, str]:
    """``{dotted module name: its docstring's summary}`` of every module of the package but migrations.

    The summary is the docstring's first paragraph on one line, its ````literals```` as Markdown's.
    """
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(REPOSITORY).with_suffix("")
        if "migrations" in relative.parts:
            continue
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        summary = " ".join(docstring.strip().split("\n\n")[0].split())
        found[".".join(parts)] = summary.replace("``", "`").replace("|", "\\|")
    return found


def floor_of(module: str, layered: list[list[str]]) -> int | None:
    """The index of the floor ``module`` stands on (None: the package itself, above every floor)."""
    for index, floor in enumerate(layered):
        if any(module == name or module.startswith(name + ".") for name in floor):
            return index
    return None


def module_map() -> str:
    """The section "Every module" as it must read."""
    layered, described = floors(), modules()
    lines = [
        HEADING,
        "",
        "Every module of the package, floor by floor from the top, as the layers contract of",
        "`pyproject.toml` stacks them (a module imports only from floors below its own), each with",
        "its docstring's summary. `tests/project/test_module_map.py` holds this list to the",
        "code; `python -m tests.project.test_module_map` writes it anew.",
        "",
        "### The package",
        "",
        "| module | what it is |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | {text} |" for name, text in described.items() if floor_of(name, layered) is None]
    for index, floor in enumerate(layered):
        lines += ["", f"### Floor {len(layered) - index}: {', '.join(f'`{n}`' for n in floor)}", ""]
        lines += ["| module | what it is |", "|---|---|"]
        lines += [f"| `{name}` | {text} |" for name, text in described.items() if floor_of(name, layered) == index]
    return "\n".join(lines) + "\n"


def written_map() -> str:
    """The section as ``docs/architecture.md`` has it (up to the next second-level heading)."""
    page = PAGE.read_text()
    found = re.search(rf"^{HEADING}\n.*?(?=^## |\Z)", page, re.MULTILINE | re.DOTALL)
    return "" if found is None else found.group(0).rstrip("\n") + "\n"


def test_every_module_of_the_package_has_a_docstring():
    assert [name for name, text in modules().items() if not text] == []


def test_every_module_stands_on_a_floor_of_the_layers_contract():
    layered = floors()
    assert [name for name in modules() if name != "pgbus_workflows" and floor_of(name, layered) is None] == []


def test_the_architecture_page_maps_every_module_as_the_code_says():
    assert written_map() == module_map(), "the module map is stale: python -m tests.project.test_module_map"


if __name__ == "__main__":
    print(module_map(), end="")  # noqa: T201 (the section to paste into docs/architecture.md)
