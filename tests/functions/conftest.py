"""The test helpers of ``pgbus_workflows.testing`` as a pytest fixture for the durable tests."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pgbus_workflows.testing import WorkflowTestMixin


class Helpers(WorkflowTestMixin):
    """``WorkflowTestMixin`` outside a ``TestCase``: its cleanups (the virtual clock) run after the test."""

    def __init__(self) -> None:
        self.cleanups: list[Callable[[], Any]] = []

    def addCleanup(self, cleanup: Callable[[], Any]) -> None:
        """Run ``cleanup`` when the test ends, as ``TestCase.addCleanup`` does."""
        self.cleanups.append(cleanup)


@pytest.fixture
def helpers() -> Iterator[Helpers]:
    """The test helpers, with the virtual clock undone when the test ends."""
    made = Helpers()
    yield made
    for cleanup in reversed(made.cleanups):
        cleanup()
