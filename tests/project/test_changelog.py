"""The changelog's promise (its opening): each entry names the migrations it brings."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_unreleased_entry_names_every_migration_the_app_ships():
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.split("\n## ")[1]
    assert unreleased.startswith("0.1.0 - Unreleased")
    [migrations] = re.findall(r"### Migrations\n\n`(\d{4})` to `(\d{4})`", unreleased)
    shipped = sorted(
        path.name[:4] for path in (ROOT / "pgbus_workflows" / "migrations").glob("[0-9][0-9][0-9][0-9]_*.py")
    )
    assert migrations == (shipped[0], shipped[-1])
