"""The package's layout keeps its promises (docs/architecture.md): no import cycle, short modules, a small root.

import-linter (run by CI) checks the layers; these checks read the package as it is, so a
cycle made only by an annotation, a module grown past 400 lines or a new module at the root
fails here too, with its name.
"""

import ast
import re
from pathlib import Path

import grimp
import pytest

import pgbus_workflows

PACKAGE = Path(pgbus_workflows.__file__).parent
MAX_LINES = 400
MAX_ROOT_MODULES = 15


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of modules that import each other round in a circle (Tarjan's strongly connected components)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in order:
            visit(module)
    return cycles


def test_no_module_imports_itself_round_a_circle_even_for_annotations():
    graph = grimp.build_graph("pgbus_workflows", exclude_type_checking_imports=False)
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_made_only_for_annotations():
    graph = grimp.build_graph("pgbus_workflows", exclude_type_checking_imports=False)
    graph.add_import(importer="pgbus_workflows.dsl.definitions", imported="pgbus_workflows.workflow")
    assert any("pgbus_workflows.dsl.definitions" in cycle for cycle in import_cycles(graph))


def test_a_childs_end_reaches_its_parent_by_calls_down_the_stack():
    """docs/architecture.md, "A child's end reaches its parent": no signal in the engine, locks call the resolution."""
    graph = grimp.build_graph("pgbus_workflows", exclude_type_checking_imports=False)
    services = "pgbus_workflows.services"
    assert graph.direct_import_exists(importer=f"{services}.locks", imported=f"{services}.resolution")
    below = ["resolution", "ledger", "lineage", "waiting", "outcome"]
    assert [m for m in below if graph.chain_exists(importer=f"{services}.{m}", imported=f"{services}.locks")] == []
    signalling = []
    for path in sorted((PACKAGE / "services").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("django.dispatch"):
                signalling.append(path.name)
    assert signalling == []


def test_no_module_is_over_400_lines():
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts and (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_root_keeps_at_most_15_modules():
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


REPOSITORY = PACKAGE.parent
#: A repository path in backquotes, such as ``tests/...``, ``pgbus_workflows/...`` or ``docs/...``.
CITED_PATH = re.compile(r"`((?:tests|pgbus_workflows|docs|bench|scripts)/[\w./-]+)`")


#: The folders .gitignore names by their path (``docs/_build/``, ``bench/.peers/``): commands make them.
GENERATED_FOLDERS = tuple(
    line
    for line in (REPOSITORY / ".gitignore").read_text().splitlines()
    if line.endswith("/") and "/" in line[:-1] and not line.startswith(("#", "*"))
)


def cited_paths(text: str) -> set[str]:
    """The paths ``text`` cites, but those in a folder a command makes (``GENERATED_FOLDERS``)."""
    paths = {path.rstrip("/.") for path in CITED_PATH.findall(text)}
    return {path for path in paths if not f"{path}/".startswith(GENERATED_FOLDERS)}


#: Every page of the README and the docs site; the first two cite paths by design.
DOC_PAGES = [
    "README.md",
    *sorted(
        str(path.relative_to(REPOSITORY)) for path in (REPOSITORY / "docs").rglob("*.md") if "_build" not in path.parts
    ),
]


def test_a_path_a_command_makes_is_not_held_to_exist():
    text = "`docs/_build/html` `bench/.peers/` `docs/index.md` `docs/missing.md`"
    assert cited_paths(text) == {"docs/index.md", "docs/missing.md"}


@pytest.mark.parametrize("page", DOC_PAGES)
def test_every_path_a_page_cites_is_in_the_repository(page):
    cited = cited_paths((REPOSITORY / page).read_text())
    if page in ("README.md", "docs/architecture.md"):
        assert cited, f"{page} cites no path: the pattern no longer matches how it cites them"
    assert sorted(path for path in cited if not (REPOSITORY / path).exists()) == []


def test_nothing_shipped_or_tested_cites_the_design_notes_users_do_not_have():
    files = [*PACKAGE.rglob("*.py"), *(REPOSITORY / "tests").rglob("*.py"), REPOSITORY / "README.md"]
    citing = [
        str(path.relative_to(REPOSITORY))
        for path in files
        if path != Path(__file__) and re.search(r"\b(DESIGN|LAYOUT)\.md\b", path.read_text())
    ]
    assert citing == []
