"""What this process's code can run, so a dispatcher never claims work that only newer code knows.

During a rolling deploy the web tier may start runs of a class (or reach a step) that older
dispatchers have never heard of. A dispatcher claims only the steps of the classes it has
registered, by their names, gravestones and ``renamed_from`` names (:func:`can_run_step`),
and only the fan-out jobs whose function it can import (:func:`can_run_job`). It writes its
:func:`catalog` on its ``Dispatcher`` row, so the sweep can tell a step that *no* live
dispatcher can run (paused after ``UNKNOWN_STEP_GRACE``) from one that waits for a newer one.
"""

from __future__ import annotations

import json

from ..exceptions import ConfigurationError
from .declared import DeclaredWorkflow, registry
from .fairness import has_fairness
from .jobs import resolve_job

#: In a class's known step names: it runs a step of any name (a durable function's checkpoints).
ANY_STEP = "*"

_known_steps: dict[type, frozenset[str]] = {}
_importable: dict[str, bool] = {}


def _step_names(cls: type[DeclaredWorkflow]) -> frozenset[str]:
    names = _known_steps.get(cls)
    if names is None:
        names = _known_steps[cls] = cls.known_step_names()
    return names


def can_run_step(workflow_class: str, step_name: str) -> bool:
    """True when this process's code has the class and knows the step (or its gravestone, or an old name)."""
    cls = registry.get(workflow_class)
    return cls is not None and knows_step(_step_names(cls), step_name)


def knows_step(names: frozenset[str] | set[str] | tuple[str, ...], step_name: str) -> bool:
    """True when ``names`` (a class's known step names, or a catalog's) take ``step_name``."""
    return step_name in names or ANY_STEP in names


def can_run_job(path: str) -> bool:
    """True when this process can import the fan-out job function at ``path`` (cached: code does not change)."""
    known = _importable.get(path)
    if known is None:
        try:
            resolve_job(path)
            known = True
        except ConfigurationError:
            known = False
        _importable[path] = known
    return known


def catalog() -> dict[str, list[str]]:
    """``{class name: the step names its code runs}`` for every registered class (a dispatcher's row)."""
    return {cls.name: sorted(_step_names(cls)) for cls in registry.classes()}


def catalog_json() -> str:
    """:func:`catalog` as JSON text, made again only when the registry changes (each claim sends it)."""
    global _catalog_json
    if _catalog_json is None or _catalog_json[0] != registry.version:
        _catalog_json = (registry.version, json.dumps(catalog()))
    return _catalog_json[1]


_catalog_json: tuple[int, str] | None = None


def any_fairness() -> bool:
    """Whether a registered class declares ``Fairness`` (the claim then reads the fair order too)."""
    global _any_fairness
    if _any_fairness is None or _any_fairness[0] != registry.version:
        found = any(has_fairness(cls) for cls in registry.classes())
        _any_fairness = (registry.version, found)
    return _any_fairness[1]


_any_fairness: tuple[int, bool] | None = None
