"""Reference tables drawn from the code when the docs are built, so they cannot drift from it.

- ``{pgbus-settings}``: every ``PGBUS_WORKFLOWS`` key, its default (``conf.DEFAULTS``) and the
  ``#:`` comment on its attribute of ``conf.WorkflowSettings``.
- ``{pgbus-checks}``: every system check id, when it runs and what it finds (``checks.CHECKS``).
- ``{pgbus-event-kinds}``: every audit event kind a run records (``models.EVENT_KINDS``), and
  which of them the admin's events filter offers (``models.NOTABLE_EVENT_KINDS``).
- ``{pgbus-schedule-event-kinds}``: what a schedule's audit trail records (``ScheduleEventKind``).
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective


def markdown_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A Markdown pipe table; a ``|`` inside a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def format_default(key: str, value: Any) -> str:
    """A setting's default as a reader writes it: durations in the largest whole unit."""
    from pgbus_workflows.conf import DURATION_KEYS

    if key in DURATION_KEYS and isinstance(value, int) and not isinstance(value, bool):
        for unit, seconds in (("day", 86400), ("h", 3600), ("min", 60)):
            if value >= seconds and value % seconds == 0:
                count = value // seconds
                return f"{count} {unit}{'s' if unit == 'day' and count > 1 else ''}"
        return f"{value} s"
    return f"`{value!r}`"


def settings_rows() -> list[tuple[str, str, str]]:
    """``(key, default, meaning)`` of every setting, in ``DEFAULTS``' order."""
    from pgbus_workflows.conf import DEFAULTS

    comments = ModuleAnalyzer.for_module("pgbus_workflows.conf").find_attr_docs()
    rows = []
    for key, default in DEFAULTS.items():
        comment = comments.get(("WorkflowSettings", key))
        if not comment:
            raise ValueError(f"pgbus_workflows.conf.WorkflowSettings.{key} has no #: comment to document it")
        rows.append((f"`{key}`", format_default(key, default), " ".join(line.strip() for line in comment).strip()))
    return rows


def checks_rows() -> list[tuple[str, str, str]]:
    """``(id, when it runs, what it finds)`` of every system check, errors first."""
    from pgbus_workflows.checks import CHECKS

    order = {"E": 0, "W": 1, "I": 2}
    ids = sorted(CHECKS, key=lambda check: (order[check.split(".")[1][0]], check))
    return [(f"`{check}`", CHECKS[check][0], CHECKS[check][1]) for check in ids]


def event_kind_rows() -> list[tuple[str, str, str]]:
    """``(kind, meaning, in the admin's filter)`` of every audit event kind."""
    from pgbus_workflows.models import EVENT_KINDS, NOTABLE_EVENT_KINDS

    return [(f"`{kind}`", text, "yes" if kind in NOTABLE_EVENT_KINDS else "") for kind, text in EVENT_KINDS.items()]


def schedule_event_kind_rows() -> list[tuple[str, str]]:
    """``(kind, label)`` of every schedule event kind."""
    from pgbus_workflows.states import ScheduleEventKind

    return [(f"`{value}`", str(label)) for value, label in ScheduleEventKind.choices]


TABLES = {
    "pgbus-settings": (("key", "default", "meaning"), settings_rows),
    "pgbus-checks": (("id", "runs with", "what it finds"), checks_rows),
    "pgbus-event-kinds": (("kind", "what happened", "in the events filter"), event_kind_rows),
    "pgbus-schedule-event-kinds": (("kind", "shown as"), schedule_event_kind_rows),
}


class ReferenceTable(SphinxDirective):
    """One of :data:`TABLES`, by the directive's own name, parsed as the page's Markdown."""

    def run(self) -> list[Any]:
        header, rows = TABLES[self.name]
        return self.parse_text_to_nodes(markdown_table(header, rows()))


def setup(app: Sphinx) -> dict[str, Any]:
    """Register a directive per table."""
    for name in TABLES:
        app.add_directive(name, ReferenceTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
