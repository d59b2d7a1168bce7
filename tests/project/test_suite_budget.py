"""The test suite's own promises (docs/development.md): its budgets and a quick flush."""

import re
from pathlib import Path

from django.core.management.color import no_style
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def test_ci_prints_the_fast_loop_against_4_minutes_and_the_whole_suite_against_10():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "FAST_LOOP_BUDGET=240" in ci and "WHOLE_SUITE_BUDGET=600" in ci
    assert re.search(r'budget "the fast loop[^"]*" \$\(\(SECONDS - began\)\) "\$FAST_LOOP_BUDGET"', ci)
    assert re.search(r'budget "the whole suite[^"]*" \$\(\(SECONDS - began\)\) "\$WHOLE_SUITE_BUDGET"', ci)
    docs = (ROOT / "docs" / "development.md").read_text()
    assert "its budget is 4 minutes on a machine of two cores, and 10 for the whole suite" in docs


def test_a_transactional_tests_flush_deletes_the_rows_and_truncates_only_to_reset_sequences():
    tables = ["pgbus_workflows_workflowrun", "pgbus_workflows_workflowstep"]

    flush = connection.ops.sql_flush(no_style(), tables)
    assert flush == [f'DELETE FROM "{table}";' for table in tables]
    assert all("TRUNCATE" in line for line in connection.ops.sql_flush(no_style(), tables, reset_sequences=True))


def test_every_foreign_key_is_deferred_so_the_deletes_order_does_not_matter(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint WHERE contype = 'f' AND NOT condeferred")
        assert cursor.fetchall() == []
