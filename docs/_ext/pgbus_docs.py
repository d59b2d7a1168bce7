"""Pages drawn from the code when the docs are built, so they cannot drift from it.

- ``{pgbus-state-machine} run`` (or ``step``, ``job``, ``signal``): the transitions of
  ``pgbus_workflows.states`` as a Graphviz diagram (``sphinx.ext.graphviz``, SVG).
- ``{pgbus-command} workflows``: a management command's help, and each subcommand's, as its
  parser prints them.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.ext.graphviz import graphviz
from sphinx.util.docutils import SphinxDirective


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


class StateMachine(SphinxDirective):
    """``{pgbus-state-machine} run|step|job|signal``: that machine, drawn from ``states.py``."""

    required_arguments = 1
    option_spec = {"caption": directives.unchanged}

    def run(self) -> list[Any]:
        machine = self.arguments[0]
        if machine not in ("run", "step", "job", "signal"):
            raise self.error(f"pgbus-state-machine: unknown machine {machine!r} (run, step, job or signal)")
        node = graphviz()
        node["code"] = state_machine_dot(machine)
        node["options"] = {"docname": self.env.docname}
        node["alt"] = f"The {machine} state machine of pgbus_workflows.states"
        if "caption" in self.options:
            node["caption"] = self.options["caption"]
        return [node]


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
    app.setup_extension("sphinx.ext.graphviz")
    app.add_directive("pgbus-state-machine", StateMachine)
    app.add_directive("pgbus-command", CommandHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
