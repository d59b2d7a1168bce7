"""Where the app's reads go: ``READ_DATABASE`` inside ``reading()``, the primary everywhere else.

The pages and commands that only show rows (the admin's lists, the dashboard, insights, the
metrics scrape, the CLI's and MCP's read tools) run inside :func:`reading`; there every query
of the app's models that reads (a filter, a count, a ``get``) goes to the ``READ_DATABASE``
alias, a streaming replica for instance. A query that writes, or locks (``select_for_update``,
``update``, ``delete``, ``create``), goes to the primary even there: Django marks those
querysets ``_for_write``. Nothing that decides a write (a verb, a claim, a start, a signal, the
sweep) runs inside :func:`reading`, since a replica may be behind: they read the primary.

The alias is carried by a context variable, not a database router: a router's choice would
hold for every read of the process, the engine's included (check ``pgbus_workflows.E016``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

from django.db import DEFAULT_DB_ALIAS, models

from ..conf import settings

_M = TypeVar("_M", bound=models.Model)

#: The alias the app's reads go to in this context (None: the primary, through Django's routers).
_reading: ContextVar[str | None] = ContextVar("pgbus_workflows_reading", default=None)


def read_alias() -> str:
    """The alias the app's reads go to here: the one :func:`reading` set, else ``default``."""
    return _reading.get() or DEFAULT_DB_ALIAS


@contextmanager
def reading(alias: str | None = None) -> Iterator[str]:
    """Send the reads of the app's models in this block to ``alias`` (``READ_DATABASE`` when None).

    Yields the alias. Writes and locking reads still go to the primary; ``reading("default")``
    brings a block inside a replica's reads back to the primary (the health report does).
    """
    chosen = alias or settings.READ_DATABASE
    token = _reading.set(chosen)
    try:
        yield chosen
    finally:
        _reading.reset(token)


class ReadingQuerySet(models.QuerySet[_M]):
    """A queryset that reads from the alias of :func:`reading` when none was chosen with ``using()``."""

    @property
    def db(self) -> str:
        """The alias this queryset runs on: ``using()``'s, else the primary to write, else :func:`read_alias`."""
        # QuerySet's own attributes, which django-stubs does not declare.
        if self._db is None and not self._for_write:  # type: ignore[attr-defined]
            chosen = _reading.get()
            if chosen is not None:
                return chosen
        return super().db
