"""The registry of workflow classes by their stable ``name`` (the name stored in rows).

Shaped like ``AdminSite``: a ``_registry`` dict, so ``autodiscover_modules`` can roll it
back when a ``workflows`` module fails to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import apps
from django.utils.module_loading import autodiscover_modules

from ..conf import settings
from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from ..workflow import Workflow


class AlreadyRegistered(ConfigurationError):
    """Two different workflow classes claim one ``name``."""


class NotRegistered(ConfigurationError):
    """No workflow class is registered under a name."""


class WorkflowRegistry:
    """Workflow classes by name. Defining a ``Workflow`` subclass registers it."""

    def __init__(self) -> None:
        self._registry: dict[str, type[Workflow]] = {}
        #: Classes first defined after the app registry was ready (not by autodiscovery, nor by
        #: an app's ``ready()``): a dispatcher, which imports only those, may not know them.
        self._late: set[str] = set()
        #: What a run whose class is gone loads as: ``workflow/__init__.py`` sets the bare ``Workflow``
        #: here, so the services below it never import it.
        self.fallback: type[Workflow] | None = None
        #: Changes whenever a class is registered or forgotten (what depends on the set of classes caches by it).
        self.version = 0

    def register(self, cls: type[Workflow]) -> None:
        """Register ``cls`` under ``cls.name``; a second class with that name is an error.

        The same class defined again (same module and qualified name, as when a module is
        reloaded) replaces the first.
        """
        existing = self._registry.get(cls.name)
        if existing is not None and existing is not cls:
            same = (existing.__module__, existing.__qualname__) == (cls.__module__, cls.__qualname__)
            if not same:
                raise AlreadyRegistered(
                    f"Workflow name {cls.name!r} is taken by {existing.__module__}.{existing.__qualname__}; "
                    f"{cls.__module__}.{cls.__qualname__} needs another `name = ...`"
                )

        if apps.ready and existing is None:
            self._late.add(cls.name)
        self._registry[cls.name] = cls
        self.version += 1

    def registered_late(self, name: str) -> bool:
        """True when the class of ``name`` was defined after Django's app registry was ready."""
        return name in self._late

    def unregister(self, name: str) -> None:
        """Forget the class registered under ``name`` (tests use this)."""
        if name not in self._registry:
            raise NotRegistered(f"No workflow class is registered as {name!r}")
        del self._registry[name]
        self._late.discard(name)
        self.version += 1

    def is_registered(self, name: str) -> bool:
        """True when a class is registered under ``name``."""
        return name in self._registry

    def get(self, name: str) -> type[Workflow] | None:
        """The class registered under ``name``, or None when it is gone."""
        return self._registry.get(name)

    def class_for(self, name: str) -> type[Workflow]:
        """The class registered under ``name``, or the bare ``Workflow`` (``fallback``) when it is gone."""
        found = self._registry.get(name) or self.fallback
        if found is None:
            raise NotRegistered(f"No workflow class is registered as {name!r}")
        return found

    def classes(self) -> list[type[Workflow]]:
        """Every registered class, by name."""
        return [self._registry[name] for name in sorted(self._registry)]


registry = WorkflowRegistry()


def autodiscover() -> None:
    """Import the ``AUTODISCOVER_MODULE`` (default ``workflows``) of every installed app."""

    module = settings.AUTODISCOVER_MODULE
    if module:
        autodiscover_modules(module, register_to=registry)
