"""The names a durable function's rows hold (a module without models: the package root imports it)."""

#: The name of a row that runs the function on to its next checkpoint. ``@`` is refused in a
#: checkpoint's name, so no checkpoint can collide with it.
ENTRY = "@function"

#: The output of a checkpoint row that failed with ``on_exception="raise"`` (its error is in the row).
RAISED = {"step_failed": True}


def class_name(error: BaseException) -> str:
    """The dotted class of ``error`` as rows store it (a builtin's bare name)."""
    klass = type(error)
    return klass.__qualname__ if klass.__module__ == "builtins" else f"{klass.__module__}.{klass.__qualname__}"
