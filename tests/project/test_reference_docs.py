"""The reference pages drawn from the code: every setting, check id and event kind the code has, and no other.

The docs build (``bash scripts/docs``, in CI) renders the tables from ``conf.py``, ``checks.py``
and ``models/records.py``; these tests hold those catalogues to what the code reads, gives and
writes, so a new setting, check or event kind without its line fails here.
"""

import re
import sys
from pathlib import Path

from pgbus_workflows.checks import CHECKS
from pgbus_workflows.conf import DEFAULTS, settings
from pgbus_workflows.models import EVENT_KINDS, NOTABLE_EVENT_KINDS

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGE = REPOSITORY / "pgbus_workflows"
sys.path.insert(0, str(REPOSITORY / "docs" / "_ext"))

from pgbus_reference import format_default, markdown_table, settings_rows  # noqa: E402  (the docs' extension)

#: ``id="pgbus_workflows.W004"``, and the settings checks' ``_error(key, problem, "E005")``.
CHECK_ID = re.compile(r'"pgbus_workflows\.([EWI]\d{3})"|"([EWI]\d{3})"\)')
#: ``kind="step_failed"`` and ``ledger.event("rerun", ...)``, over several lines too.
EVENT_KIND = re.compile(r'\bkind="(\w+)"|\bevent\(\s*"(\w+)"')


def source_files(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*.py") if "migrations" not in path.parts]


def found(pattern: re.Pattern[str], files: list[Path]) -> set[str]:
    return {a or b for path in files for a, b in pattern.findall(path.read_text())}


def test_every_setting_has_a_documented_attribute_and_the_table_shows_its_default():
    rows = {key.strip("`"): (default, meaning) for key, default, meaning in settings_rows()}
    assert list(rows) == list(DEFAULTS)
    assert all(meaning for _default, meaning in rows.values())
    assert all(key in settings.__class__.__annotations__ for key in DEFAULTS)
    assert rows["RETENTION"][0] == "30 days"
    assert rows["SWEEP_INTERVAL"][0] == "1 min"
    assert rows["MAX_CHILD_DEPTH"][0] == f"`{DEFAULTS['MAX_CHILD_DEPTH']}`"
    assert format_default("POLL_INTERVAL", 90) == "90 s"
    assert format_default("WAITING_VISIBILITY_THRESHOLD", 86400) == "1 day"


def test_the_checks_catalogue_has_every_id_the_code_gives_and_no_other():
    given = {f"pgbus_workflows.{code}" for code in found(CHECK_ID, source_files(PACKAGE))}
    assert len(given) >= 25, "the pattern no longer matches how the code gives check ids"
    assert set(CHECKS) == given
    assert {when for when, _what in CHECKS.values()} == {"every check", "check --database default"}


def test_the_event_kinds_catalogue_has_every_kind_the_services_write_and_no_other():
    written = found(EVENT_KIND, source_files(PACKAGE / "services") + source_files(PACKAGE / "functions"))
    assert len(written) >= 25, "the pattern no longer matches how the services write events"
    assert set(EVENT_KINDS) == written
    assert set(NOTABLE_EVENT_KINDS) <= set(EVENT_KINDS)
    assert all(text.endswith(".") for text in EVENT_KINDS.values())


def test_a_pipe_in_a_cell_does_not_split_the_row():
    table = markdown_table(("a", "b"), [("x | y", "z")])
    assert table.splitlines()[-1] == "| x \\| y | z |"


def test_the_reference_pages_hold_their_tables():
    settings_page = (REPOSITORY / "docs" / "reference" / "settings.md").read_text()
    events_page = (REPOSITORY / "docs" / "reference" / "events.md").read_text()
    assert "```{pgbus-settings}" in settings_page and "```{pgbus-checks}" in settings_page
    assert "```{pgbus-event-kinds}" in events_page and "```{pgbus-schedule-event-kinds}" in events_page
