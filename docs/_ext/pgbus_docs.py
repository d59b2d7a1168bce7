"""Pages drawn from the code when the docs are built, so they cannot drift from it.

- ``{pgbus-state-machine} run`` (or ``step``, ``job``, ``signal``): the transitions of
  ``pgbus_workflows.states`` as a diagram: an SVG file drawn by Graphviz and kept beside the
  pages (``docs/explanation/states/``), so the build needs no Graphviz; the file carries the
  digest of the source it was drawn from, and a build whose ``states.py`` says otherwise
  fails, naming ``python docs/_ext/pgbus_docs.py`` (which draws them anew, with Graphviz).
- ``{pgbus-command} workflows``: a management command's help, and each subcommand's, as its
  parser prints them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

MACHINES = ("run", "step", "job", "signal")
#: Where the drawn diagrams are kept, one ``<machine>.svg`` each.
DIAGRAMS = Path(__file__).resolve().parents[1] / "explanation" / "states"
#: The first line of a drawn diagram: its machine and the digest of the Graphviz source.
DIGEST_LINE = re.compile(r"<!-- pgbus-state-machine (\w+) sha256:([0-9a-f]{64}) -->")


def _edges(machine: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The states of ``machine`` (in their declared order) and its labelled edges (source, target, label)."""
    from pgbus_workflows import states

    edges: dict[tuple[str, str], list[str]] = {}
    if machine == "run":
        nodes = list(states.RunStatus.values)
        for name, pairs in states.RUN_TRANSITIONS.items():
            for source, target in pairs:
                edges.setdefault((source, target), []).append(name)
    elif machine == "step":
        nodes = list(states.StepStatus.values)
        for name, (sources, target) in states.STEP_EVENTS.items():
            for source in sources:
                edges.setdefault((source, target), []).append(name)
    elif machine == "job":
        nodes = list(states.JobStatus.values)
        for name, (source, target) in states.JOB_EVENTS.items():
            edges.setdefault((source, target), []).append(name)
    else:
        nodes = list(states.SignalStatus.values)
        for name, (source, target) in states.SIGNAL_EVENTS.items():
            edges.setdefault((source, target), []).append(name)
    order = {node: index for index, node in enumerate(nodes)}
    labelled = [(s, t, ", ".join(sorted(names))) for (s, t), names in edges.items()]
    return nodes, sorted(labelled, key=lambda edge: (order[edge[0]], order[edge[1]], edge[2]))


def state_machine_dot(machine: str) -> str:
    """The Graphviz source of one of ``states.py``'s machines; terminal states drawn doubled."""
    nodes, edges = _edges(machine)
    leaves = {source for source, _target, _label in edges}  # a state with no way out is terminal
    lines = [
        "digraph {",
        '  rankdir=LR; bgcolor="transparent";',
        '  node [shape=box, style="rounded", fontname="sans-serif", fontsize=11];',
        '  edge [fontname="sans-serif", fontsize=9];',
    ]
    for node in nodes:
        shape = ", peripheries=2" if node not in leaves else ""
        lines.append(f'  "{node}" [label="{node}"{shape}];')
    for source, target, label in edges:
        lines.append(f'  "{source}" -> "{target}" [label="{label}"];')
    lines.append("}")
    return "\n".join(lines)


def source_digest(machine: str) -> str:
    """The SHA-256 of :func:`state_machine_dot` of ``machine``: what a drawn diagram must carry."""
    return hashlib.sha256(state_machine_dot(machine).encode()).hexdigest()


def stale_diagrams() -> list[str]:
    """The machines whose kept diagram is missing or was drawn from another source than ``states.py`` gives."""
    stale = []
    for machine in MACHINES:
        path = DIAGRAMS / f"{machine}.svg"
        first = path.read_text().split("\n", 1)[0] if path.exists() else ""
        found = DIGEST_LINE.fullmatch(first)
        if found is None or found.groups() != (machine, source_digest(machine)):
            stale.append(machine)
    return stale


def draw_diagrams() -> None:
    """Draw every machine's diagram with Graphviz's ``dot`` into :data:`DIAGRAMS` (its digest on the first line)."""
    if shutil.which("dot") is None:
        raise SystemExit("drawing the state diagrams needs Graphviz's dot: apt-get install graphviz")
    DIAGRAMS.mkdir(exist_ok=True)
    for machine in MACHINES:
        drawn = subprocess.run(
            ["dot", "-Tsvg"], input=state_machine_dot(machine), capture_output=True, text=True, check=True
        ).stdout
        body = drawn[drawn.index("<svg") :]  # without the XML declaration and doctype: the digest line comes first
        line = f"<!-- pgbus-state-machine {machine} sha256:{source_digest(machine)} -->"
        (DIAGRAMS / f"{machine}.svg").write_text(f"{line}\n{body}")


class StateMachine(SphinxDirective):
    """``{pgbus-state-machine} run|step|job|signal``: that machine, drawn from ``states.py``."""

    required_arguments = 1
    option_spec = {"caption": directives.unchanged}

    def run(self) -> list[Any]:
        machine = self.arguments[0]
        if machine not in MACHINES:
            raise self.error(f"pgbus-state-machine: unknown machine {machine!r} (run, step, job or signal)")
        if machine in stale_diagrams():
            raise self.error(
                f"pgbus-state-machine: docs/explanation/states/{machine}.svg was not drawn from today's "
                "states.py: run python docs/_ext/pgbus_docs.py (it needs Graphviz's dot) and commit the files"
            )
        self.env.note_dependency(str(DIAGRAMS / f"{machine}.svg"))
        alt = f"The {machine} state machine of pgbus_workflows.states"
        image = nodes.image(uri=f"/explanation/states/{machine}.svg", alt=alt)
        if "caption" not in self.options:
            return [image]
        figure = nodes.figure("", image)
        figure += nodes.caption(self.options["caption"], self.options["caption"])
        return [figure]


def command_help(name: str) -> list[tuple[str, str]]:
    """``(title, help text)`` of ``manage.py name`` and of each of its subcommands (and theirs)."""
    from django.core.management import get_commands, load_command_class

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the same width on every machine
    command = load_command_class(get_commands()[name], name)
    parser = command.create_parser("manage.py", name)
    found: list[tuple[str, str]] = []

    def walk(title: str, current: argparse.ArgumentParser) -> None:
        found.append((title, current.format_help()))
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{title} {sub_name}", sub)

    walk(f"manage.py {name}", parser)
    return found


class CommandHelp(SphinxDirective):
    """``{pgbus-command} NAME``: the help of ``manage.py NAME`` and of its subcommands, a section each."""

    required_arguments = 1

    def run(self) -> list[Any]:
        result: list[Any] = []
        for title, text in command_help(self.arguments[0]):
            section = nodes.section(ids=[nodes.make_id(title)])
            section += nodes.title(text=title)
            section += nodes.literal_block(text, text)
            result.append(section)
        return result


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directives."""
    app.add_directive("pgbus-state-machine", StateMachine)
    app.add_directive("pgbus-command", CommandHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # python docs/_ext/pgbus_docs.py: draw the diagrams anew
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()
    draw_diagrams()
    print(f"drew {', '.join(MACHINES)} into {DIAGRAMS}")
