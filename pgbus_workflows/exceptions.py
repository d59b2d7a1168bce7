"""Every error the library raises, under one base class, :class:`WorkflowError`."""

from __future__ import annotations

from typing import Any


class WorkflowError(Exception):
    """Base class of every error pgbus_workflows raises on purpose."""


class ConfigurationError(WorkflowError):
    """A workflow class, a step option or a setting is wrong; raised when it is defined."""


class AlreadyRunning(WorkflowError):
    """``start()`` for a subject that already has an ongoing run of the class.

    ``workflow`` is a handle on the run that holds the slot.
    """

    def __init__(self, message: str, workflow: Any = None) -> None:
        super().__init__(message)
        self.workflow = workflow


class IdempotencyConflict(WorkflowError, ValueError):
    """``start()`` with an idempotency key already used for another subject or other arguments.

    Nothing is written. ``workflow`` is a handle on the run that holds the key.
    """

    def __init__(self, message: str, workflow: Any = None) -> None:
        super().__init__(message)
        self.workflow = workflow


class UnknownSignal(WorkflowError, ValueError):
    """A signal name that no step of the run's class waits for (and not in ``extra_signals``)."""


class NotMigrated(WorkflowError):
    """The database lacks this app's tables or columns: run ``manage.py migrate``."""


class InvalidTransition(WorkflowError):
    """A state move that the transition table does not allow from the run's status."""


class NotPaused(InvalidTransition):
    """``resume()`` or ``resume_at()`` on a run that is not paused."""


class NotOngoing(InvalidTransition):
    """A signal for a finished or cancelled run, or for a subject with no ongoing run."""


class StepNotDefined(WorkflowError):
    """A row or a verb names a step that the workflow class does not define."""


class StepStalled(WorkflowError):
    """Recorded on a step whose dispatcher died or that outlived its ``stall_at``."""


class PayloadTooLarge(WorkflowError):
    """Arguments, an output or a signal payload larger than ``MAX_PAYLOAD_SIZE``."""


class PayloadNotSerializable(WorkflowError, TypeError):
    """Arguments, an output or a payload that ``DjangoJSONEncoder`` cannot encode."""


class NotInStep(WorkflowError):
    """A step-only verb or reader used outside a running step body."""


class FanOutFailed(WorkflowError):
    """Recorded on a fan-out step some of whose jobs failed."""


class ChildConflict(WorkflowError):
    """A ``Child`` cannot be started: its key belongs to a run that is not a child of this step."""


class ChildDepthExceeded(WorkflowError):
    """A fan-out would start children deeper than ``MAX_CHILD_DEPTH`` (runaway recursion)."""


class WorkflowCancelled(WorkflowError):
    """``result()`` of a run that was cancelled (``workflow`` is its handle)."""

    def __init__(self, message: str, workflow: Any = None) -> None:
        super().__init__(message)
        self.workflow = workflow


class WaitTimedOut(WorkflowError):
    """Recorded on a waiting step whose ``wait_timeout`` passed with ``on_timeout="pause"``."""


class StepWaiting(WorkflowError):
    """A test helper reached a step that waits for a signal or a fan-out."""


class TestHelperError(WorkflowError):
    """A test helper was asked to move a run that it cannot move in its current state."""

    __test__ = False  # not a pytest test class


class StepFailed(WorkflowError):
    """A durable function's checkpoint failed with ``on_exception="raise"``: raised into the function.

    ``step`` is the checkpoint's name (``page#2``), ``exception_type`` the dotted class of what its
    body raised and ``message`` its text; the same on every replay of the function.
    """

    def __init__(self, step: str, exception_type: str, message: str) -> None:
        super().__init__(f"Checkpoint {step} failed: {exception_type}: {message}")
        self.step = step
        self.exception_type = exception_type
        self.message = message


class NonDeterministicRun(WorkflowError):
    """A durable function's replay met another checkpoint than the one recorded at that position.

    The run pauses with this error, naming both: the code changed under a running function, or it
    decides its checkpoints from something that is not recorded (the clock, random numbers).
    """
