"""Checkpoint bodies the durable tests share: each records its label, and fails while told to."""

from tests.support import labels, record

#: Labels whose bodies fail (emptied around every test of the folder: ``tests/functions/conftest.py``).
FAILING: set[str] = set()


class FlakyError(Exception):
    """Raised by checkpoint bodies on purpose."""


def effect(label: str, counted: bool = False):
    """A checkpoint body: records ``label``, raises :class:`FlakyError` while ``label`` is in :data:`FAILING`.

    It returns ``label``; ``counted``: followed by how many bodies had run by then, so a body
    run again returns another value than the one recorded.
    """

    def body():
        record(label)
        if label in FAILING:
            raise FlakyError(f"{label} failed")
        return f"{label} {len(labels())}" if counted else label

    return body
