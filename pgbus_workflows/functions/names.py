"""The names a durable function's rows hold (a module without models: the package root imports it)."""

from typing import NamedTuple

#: The name of a row that runs the function on to its next checkpoint. ``@`` is refused in a
#: checkpoint's name, so no checkpoint can collide with it.
ENTRY = "@function"

#: The output of a checkpoint row that failed with ``on_exception="raise"`` (its error is in the row).
RAISED = {"step_failed": True}


def class_name(error: BaseException) -> str:
    """The dotted class of ``error`` as rows store it (a builtin's bare name)."""
    klass = type(error)
    return klass.__qualname__ if klass.__module__ == "builtins" else f"{klass.__module__}.{klass.__qualname__}"


class Renaming(NamedTuple):
    """What the function's row (:data:`ENTRY`) becomes with a checkpoint's outcome, and the row after it."""

    #: The checkpoint the function reached on the row.
    checkpoint: str
    #: The row's attempt of that checkpoint (the first, or the next after a rewind's).
    attempt: int
    #: The attempt of the function's row that carries the function on, as if the row had been
    #: renamed before: one more than the other :data:`ENTRY` rows' highest.
    entry_attempt: int
