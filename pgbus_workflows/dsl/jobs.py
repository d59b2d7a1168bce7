"""The members of a fan-out: jobs (functions) and children (workflow runs).

A job is stored by the dotted path of its function; the path is checked when the job is
made and again when it runs, so no path read from the database can run anything but a
module-level function of an installed app. A child is a run of another workflow class,
started in the transaction that parks the fan-out step.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import FunctionType
from typing import Any

from django.apps import apps
from django.utils.module_loading import import_string

from ..exceptions import ConfigurationError
from .backoff import Backoff
from .definitions import StepDefinition, WaitSpec, coerce_duration

#: The longest job path the jobs table stores (``varchar(255)``).
MAX_PATH_LENGTH = 255


class Job:
    """One member of a fan-out: ``Job(function, *args, **kwargs)``.

    ``function`` must be a module-level function of an installed Django app: it is stored
    by dotted path and looked up (and checked again) when the job runs, so no path read
    from the database can run anything else.
    """

    def __init__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.function = function
        self.path = job_path(function)
        self.args = list(args)
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"Job({self.path}, *{self.args!r}, **{self.kwargs!r})"


#: What a parent's end (cancelled, or its fan-out step abandoned) does to an ongoing child.
PARENT_CLOSE_POLICIES = ("cancel", "abandon")


class Child:
    """One child run of a fan-out: ``Child(Shipment, parcel, carrier="dhl")``.

    ``workflow_class`` is a registered ``Workflow`` subclass; ``subject`` and the keyword
    ``arguments`` are what its ``start()`` takes. The child is started at most once per
    parent step and position: its ``idempotency_key`` defaults to one made of the parent run,
    the step and the child's index, so a reattempt of the step finds the children it started
    before. ``parent_close="cancel"`` (the default) cancels the child when its parent is
    cancelled or stops waiting for it; ``"abandon"`` lets it run on.
    """

    def __init__(
        self,
        workflow_class: Any,
        subject: Any = None,
        *,
        idempotency_key: str | None = None,
        parent_close: str = "cancel",
        **arguments: Any,
    ) -> None:
        if not isinstance(workflow_class, type) or not hasattr(workflow_class, "step_definitions"):
            raise ConfigurationError(f"Child() takes a Workflow subclass, got {workflow_class!r}")
        if parent_close not in PARENT_CLOSE_POLICIES:
            raise ConfigurationError(
                f"parent_close must be one of {', '.join(PARENT_CLOSE_POLICIES)}, got {parent_close!r}"
            )
        self.workflow_class = workflow_class
        self.subject = subject
        self.idempotency_key = idempotency_key
        self.parent_close = parent_close
        self.arguments = arguments

    def __repr__(self) -> str:
        return f"Child({self.workflow_class.__name__}, {self.subject!r}, **{self.arguments!r})"


def job_path(function: Any) -> str:
    """The dotted path of a job function; raises :class:`ConfigurationError` for anything else."""
    if not isinstance(function, FunctionType):
        raise ConfigurationError(f"A fan-out job must be a plain function, got {function!r}")
    if "." in function.__qualname__ or "<" in function.__qualname__:
        raise ConfigurationError(f"A fan-out job must be a module-level function, not {function.__qualname__}")
    path = f"{function.__module__}.{function.__qualname__}"
    if len(path) > MAX_PATH_LENGTH:
        raise ConfigurationError(f"A fan-out job's dotted path must be at most {MAX_PATH_LENGTH} characters: {path}")
    if resolve_job(path) is not function:
        raise ConfigurationError(f"{path} does not import back as the same function")
    return path


def resolve_job(path: str) -> FunctionType:
    """The job function at ``path``, only when it is a module-level function of an installed app."""

    module = path.rpartition(".")[0]
    if not any(module == app.name or module.startswith(app.name + ".") for app in apps.get_app_configs()):
        raise ConfigurationError(f"Fan-out job {path} is not in an installed app: refusing to run it")
    try:
        function = import_string(path)
    except ImportError as error:
        raise ConfigurationError(f"Fan-out job {path} cannot be imported: {error}") from error
    if not isinstance(function, FunctionType) or f"{function.__module__}.{function.__qualname__}" != path:
        raise ConfigurationError(f"{path} is not a module-level function")
    return function


def backoff_payload(spec: Any, what: str) -> Any:
    """A job backoff as its row stores it: seconds, or a ``backoff()``'s fields; None for none.

    Stored with each job (a durable function's ``ctx.map``), so that whichever process ends
    an attempt waits as asked. Any other callable raises :class:`ConfigurationError`.
    """
    if spec is None:
        return None
    if isinstance(spec, Backoff):
        top = None if spec.max is None else spec.max.total_seconds()
        return {"base": spec.base.total_seconds(), "factor": spec.factor, "max": top, "jitter": spec.jitter}
    if callable(spec):
        raise ConfigurationError(f"{what} takes a duration or a backoff(...), stored with each job, not {spec!r}")
    return coerce_duration(spec, what).total_seconds()


def stored_backoff(arguments: Any, definition: StepDefinition | None) -> WaitSpec:
    """The wait between a job's attempts: the one its row stores (:func:`backoff_payload`), else its step's."""
    stored = arguments.get("backoff") if isinstance(arguments, dict) else None
    if stored is None:
        return None if definition is None else definition.backoff
    if isinstance(stored, dict):
        top = stored["max"]
        return Backoff(
            base=timedelta(seconds=stored["base"]),
            factor=stored["factor"],
            max=None if top is None else timedelta(seconds=top),
            jitter=stored["jitter"],
        )
    return timedelta(seconds=stored)
