"""The test suite's own promises (docs/development.md): its budgets."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_prints_the_fast_loop_against_4_minutes_and_the_whole_suite_against_10():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "FAST_LOOP_BUDGET=240" in ci and "WHOLE_SUITE_BUDGET=600" in ci
    assert re.search(r'budget "the fast loop[^"]*" \$\(\(SECONDS - began\)\) "\$FAST_LOOP_BUDGET"', ci)
    assert re.search(r'budget "the whole suite[^"]*" \$\(\(SECONDS - began\)\) "\$WHOLE_SUITE_BUDGET"', ci)
    docs = " ".join((ROOT / "docs" / "development.md").read_text().split())
    assert "its budget is 4 minutes on a machine of two cores, and 10 for the whole suite" in docs


def test_ci_prints_the_upstream_task_tests_against_a_minute():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "UPSTREAM_BUDGET=60" in ci
    assert re.search(
        r'\n\.venv/bin/python -m tests\.upstream\.run\nbudget "[^"]*" \$\(\(SECONDS - began\)\) "\$UPSTREAM_BUDGET"', ci
    )
    docs = " ".join((ROOT / "docs" / "development.md").read_text().split())
    assert "against a budget of one minute" in docs
