"""The upstream task tests that do not apply (``tests/upstream/run.py``) are the ones ``docs/tasks.md`` lists."""

import re

from tests.procs import ROOT
from tests.upstream.run import NOT_APPLICABLE


def test_every_skipped_upstream_test_is_named_in_the_docs_with_its_class():
    docs = (ROOT / "docs" / "tasks.md").read_text()
    table = docs[docs.index("## Django's own task tests") :]
    named = set(re.findall(r"`(?:\w+\.)?(test_\w+)`", table))
    assert {test_id.rsplit(".", 1)[1] for test_id in NOT_APPLICABLE} == named
    for test_id in NOT_APPLICABLE:
        module, cls, _method = test_id.rsplit(".", 2)
        assert module.startswith("tasks.test_") and cls.endswith("TestCase")
