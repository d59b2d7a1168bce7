"""The upgrading guide's table of migrations: a measured row for every migration the app ships."""

import re
from pathlib import Path

from tests.procs import ROOT

GUIDE = (ROOT / "docs" / "upgrading.md").read_text()
MIGRATIONS = sorted(p.stem for p in Path(ROOT / "pgbus_workflows" / "migrations").glob("0*.py"))


def rows() -> dict[str, list[str]]:
    found = {}
    for line in GUIDE.splitlines():
        match = re.match(r"\| (\d{4}) \| (.*) \|$", line)
        if match:
            found[match.group(1)] = match.group(2).split(" | ")
    return found


def test_every_migration_after_the_first_has_a_row_with_its_seconds_locks_and_write_wait():
    table = rows()
    numbers = [name[:4] for name in MIGRATIONS if not name.startswith("0001")]
    assert sorted(table) == numbers
    for number, (what, seconds, locks, wait) in table.items():
        assert what and locks, number
        assert re.fullmatch(r"\d+\.\d", seconds), (number, seconds)
        assert re.fullmatch(r"\d+ ms", wait), (number, wait)
