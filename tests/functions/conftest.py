"""The test helpers of ``pgbus_workflows.testing`` as a pytest fixture for the durable tests, and no body failing."""

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pgbus_workflows.testing import WorkflowTestMixin
from tests.functions.bodies import FAILING


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


@pytest.fixture(autouse=True)
def _nothing_fails() -> Iterator[None]:
    """No shared checkpoint body (``tests/functions/bodies.py``) fails unless the test says so."""
    FAILING.clear()
    yield
    FAILING.clear()
