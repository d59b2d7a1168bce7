"""Fan-out jobs: what a job is, and which functions may run as one.

A job is stored by the dotted path of its function; the path is checked when the job is
made and again when it runs, so no path read from the database can run anything but a
module-level function of an installed app.
"""

from __future__ import annotations

from collections.abc import Callable
from types import FunctionType
from typing import Any

from django.apps import apps
from django.utils.module_loading import import_string

from .exceptions import ConfigurationError

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
