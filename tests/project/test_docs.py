"""The docs site's promises: its diagrams show what ``states.py`` allows, its Python compiles.

``bash scripts/docs`` (run by CI) builds the site with warnings as errors; these tests check
what a build that succeeds could still get wrong.
"""

import ast
import re
import sys
from pathlib import Path

import pytest

from pgbus_workflows import states

REPOSITORY = Path(__file__).resolve().parents[2]
DOCS = REPOSITORY / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

from pgbus_docs import command_help, stale_diagrams, state_machine_dot  # noqa: E402  (the docs' own extension)

PAGES = sorted(DOCS.rglob("*.md"))
#: A ```python block, or a ```{code-block} python one after its options (``:caption: orders/models.py``).
PYTHON_BLOCK = re.compile(
    r"^```(?:python|\{code-block\} python)\n(?::[\w-]+:[^\n]*\n)*\n?(.*?)^```", re.DOTALL | re.MULTILINE
)


def edges(dot: str) -> set[tuple[str, str, str]]:
    found = set()
    for source, target, label in re.findall(r'"(\w+)" -> "(\w+)" \[label="([\w, ]+)"\]', dot):
        found |= {(source, target, name) for name in label.split(", ")}
    return found


def test_the_run_diagram_has_an_edge_for_every_move_the_table_allows_and_no_other():
    allowed = {(s, t, name) for name, pairs in states.RUN_TRANSITIONS.items() for s, t in pairs}
    assert edges(state_machine_dot("run")) == allowed


def test_the_step_diagram_has_an_edge_for_every_attempt_event():
    allowed = {(s, target, name) for name, (sources, target) in states.STEP_EVENTS.items() for s in sources}
    assert edges(state_machine_dot("step")) == allowed


def test_only_the_states_with_no_way_out_are_drawn_as_terminal():
    dot = state_machine_dot("run")
    terminal = set(re.findall(r'"(\w+)" \[label="\w+", peripheries=2\]', dot))
    assert terminal == {str(s) for s in states.TERMINAL_RUN}


def test_the_kept_diagrams_were_drawn_from_the_tables_states_py_has_today():
    # The docs build draws nothing (no Graphviz needed): it shows the SVG files kept in
    # docs/explanation/states/, which carry the digest of the source they were drawn from.
    assert stale_diagrams() == [], "run python docs/_ext/pgbus_docs.py (with Graphviz's dot) and commit the SVGs"


def test_a_diagram_drawn_from_other_tables_is_found_stale(tmp_path, monkeypatch):
    import pgbus_docs

    for machine in pgbus_docs.MACHINES:
        (tmp_path / f"{machine}.svg").write_text((pgbus_docs.DIAGRAMS / f"{machine}.svg").read_text())
    job = (tmp_path / "job.svg").read_text()
    digest = re.search(r"sha256:(\w+)", job).group(1)
    (tmp_path / "job.svg").write_text(job.replace(digest, "0" * 64, 1))  # drawn from another source
    monkeypatch.setattr(pgbus_docs, "DIAGRAMS", tmp_path)
    assert stale_diagrams() == ["job"]
    (tmp_path / "run.svg").unlink()
    assert stale_diagrams() == ["run", "job"]


def test_the_cli_reference_has_every_subcommand_of_the_parser():
    titles = [title for title, _text in command_help("workflows")]
    for sub in (
        "list",
        "show",
        "health",
        "pause",
        "resume",
        "cancel",
        "rerun",
        "run-now",
        "skip",
        "signal",
        "schedules",
        "limits",
    ):
        assert f"manage.py workflows {sub}" in titles
    assert "manage.py workflows schedules fire-now" in titles


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_every_python_block_of_a_page_compiles(page):
    for block in PYTHON_BLOCK.findall(page.read_text()):
        ast.parse(block, filename=str(page))


def test_the_python_blocks_pattern_finds_captioned_blocks():
    tutorial = PYTHON_BLOCK.findall((DOCS / "tutorial.md").read_text())
    assert len(tutorial) == 7 and tutorial[1].startswith("from django.db import models")


FIRST_PERSON = re.compile(r"\bI\b(?![/.])|\b(?i:my|we|our|ours|us)\b")  # "I", not "I/O"
COMMIT_HASH = re.compile(r"`[0-9a-f]{7,40}`")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(DOCS)))
def test_the_pages_state_facts_without_a_first_person_or_a_commit_hash(page):
    """The docs describe the product as it is; its history is git's (issue #41)."""
    text = PYTHON_BLOCK.sub("", page.read_text())
    assert not FIRST_PERSON.findall(text), FIRST_PERSON.findall(text)
    assert not COMMIT_HASH.findall(text), COMMIT_HASH.findall(text)


def test_the_readme_is_a_front_page_under_300_lines():
    """The README says what the product is and links the docs for the rest (issue #41)."""
    readme = (REPOSITORY / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    linked = set(re.findall(r"\]\(docs/([\w/-]+)\.md\)", readme))
    guides = {str(page.relative_to(DOCS).with_suffix("")) for page in PAGES}
    assert linked <= guides, linked - guides
    assert {
        "tutorial",
        "starting",
        "steps",
        "async",
        "flow-control",
        "signals",
        "fan-out",
        "schedules",
        "tasks",
        "operating",
        "dispatcher",
        "testing",
        "reference/settings",
    } <= linked


#: Public names of ``Workflow`` that the engine looks up and a project does not call.
ENGINE_LOOKUPS = {
    "accepts_signal",
    "copied_failure",
    "fork_point",
    "rewind_to",
    "step_names_of",
    "known_step_names",
    "name_given",
    "next_step_after",
    "removed_step_names",
    "require_step",
    "signal_names",
    "step_definition",
    "step_definitions",
}


def test_the_api_reference_lists_every_public_name_of_workflow_but_the_engines_look_ups():
    page = (DOCS / "reference" / "api.md").read_text()
    listed = re.search(r"autoclass:: pgbus_workflows\.Workflow\n   :members: (.*?)\n   :inherited-members:", page, re.S)
    documented = {name.strip() for name in listed.group(1).split(",")}
    from pgbus_workflows import Workflow

    public = {name for name in dir(Workflow) if not name.startswith("_") and name not in dir(object)}
    assert documented - public == set(), "the reference names what Workflow does not have"
    assert public - documented - ENGINE_LOOKUPS == set(), "a new public name: document it, or call it a look-up"
    assert documented & ENGINE_LOOKUPS == set()
