"""``Fairness``: claims take the due steps of several keys in turn, weighted, not in due order alone (no ORM).

A class declares ``fairness = Fairness(key=..., weight=...)`` (a step ``@step(fairness=...)``,
in place of its class's, for that step). When one of its steps is
scheduled due at once, its key (and the key's weight) is evaluated (:func:`fair_tag`) and
the step is given a place in the claims' order (``WorkflowStep.fair_at``, written by
``sql.fairness``): its due time, or one quantum divided by the weight after the last step
of its key still waiting, whichever is later. Claims take steps in priority, then that
order: a key with a long backlog takes one step in turn with a key that has few.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..exceptions import ConfigurationError
from .limits import MAX_LIMIT_KEY_LENGTH, LimitKey, valid_limit_key
from .text import unstorable

#: How far apart in the claims' order two steps of one key waiting together are (weight 1):
#: a key's second waiting step comes after another key's step due up to this much later.
FAIR_QUANTUM = timedelta(minutes=1)
#: The largest weight (a weight of w puts a key's waiting steps one quantum / w apart).
MAX_WEIGHT = 1_000_000


class Fairness:
    """Claims take the due steps of this class's keys in turn (weighted), not in due order alone.

    ``key``: a string, or a callable of the workflow handle returning one (a tenant, an
    account), evaluated when a step is scheduled. ``weight``: None (every key weighs 1), or
    a callable of the key returning an integer of at least 1: a key of weight 3 has three
    steps claimed for each step of a key of weight 1 while both have steps waiting.
    Within a key, steps are claimed in priority then due order; across keys, a key with
    100,000 waiting steps does not delay one with ten.
    """

    __slots__ = ("key", "weight")

    def __init__(self, key: LimitKey, weight: Callable[[str], int] | None = None) -> None:
        if not (callable(key) or valid_limit_key(key)):
            raise ConfigurationError(
                f"Fairness key must be a callable of the workflow or a non-empty string of at most "
                f"{MAX_LIMIT_KEY_LENGTH} characters without NUL or lone surrogates, got {key!r}"
            )
        if weight is not None and not callable(weight):
            raise ConfigurationError(f"Fairness weight must be a callable of the key or None, got {weight!r}")
        self.key: LimitKey = key
        self.weight: Callable[[str], int] | None = weight

    def __repr__(self) -> str:
        return f"Fairness(key={self.key!r}, weight={self.weight!r})"


def check_fairness_option(value: Any, where: str) -> Fairness | None:
    """``value`` when it is None or a :class:`Fairness`; ``ConfigurationError`` naming ``where`` else."""
    if value is None or isinstance(value, Fairness):
        return value
    raise ConfigurationError(f"{where} must be a Fairness, got {value!r}")


def declared_fairness(cls: Any, step_name: str) -> Fairness | None:
    """The ``Fairness`` a step of ``cls`` is under: the step's own (``@step(fairness=...)``), else the class's."""
    definition = cls.step_definition(step_name) if hasattr(cls, "step_definition") else None
    own = getattr(definition, "fairness", None)
    return own if own is not None else getattr(cls, "fairness", None)


def has_fairness(cls: Any) -> bool:
    """Whether ``cls`` or one of its steps declares ``Fairness``."""
    steps = getattr(cls, "_step_definitions", ())
    return getattr(cls, "fairness", None) is not None or any(s.fairness is not None for s in steps)


def fair_tag(cls: Any, step_name: str, handle: Callable[[], Any]) -> tuple[str, timedelta] | None:
    """``(key, spacing)`` of a step of ``cls`` about to be scheduled (None: the class has no fairness).

    ``spacing`` is :data:`FAIR_QUANTUM` divided by the key's weight. ``ValueError`` naming the
    class and the step when the key callable or the weight raises or returns something
    invalid: nothing is written.
    """
    fairness = declared_fairness(cls, step_name)
    if fairness is None:
        return None
    key: Any = fairness.key
    where = f"{cls.name}.{step_name}"
    if callable(key):
        try:
            key = key(handle())
        except Exception as error:
            raise ValueError(f"{where}: the Fairness key callable raised {type(error).__name__}: {error}") from error
        if not valid_limit_key(key):
            raise ValueError(
                f"{where}: the Fairness key must be a non-empty string of at most {MAX_LIMIT_KEY_LENGTH} "
                f"characters that PostgreSQL can store, got {key!r}"
                + (f" ({reason})" if (reason := unstorable(key)) else "")
            )
    weight: Any = 1
    if fairness.weight is not None:
        try:
            weight = fairness.weight(key)
        except Exception as error:
            raise ValueError(f"{where}: the Fairness weight raised {type(error).__name__}: {error}") from error
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
            raise ValueError(f"{where}: the Fairness weight must be an integer from 1 to {MAX_WEIGHT}, got {weight!r}")
    return key, FAIR_QUANTUM / weight
