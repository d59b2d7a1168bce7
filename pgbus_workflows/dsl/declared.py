"""What a ``Workflow`` class declares, and the registry of declared classes.

``DeclaredWorkflow`` is the class-level half of ``Workflow``: the class attributes users set,
the metaclass that collects, validates and registers a class body's steps, and the look-ups
the engine makes of a class (``step_definition``, ``next_step_after``...). It knows no row:
the handle on a run is built above it (``services.handle``, then ``workflow``).

The registry maps each class's stable ``name`` (the name stored in rows) to the class. It is
shaped like ``AdminSite``: a ``_registry`` dict, so ``autodiscover_modules`` can roll it back
when a ``workflows`` module fails to import.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, ClassVar

from django.apps import apps
from django.utils.module_loading import autodiscover_modules

from ..conf import settings
from ..exceptions import ConfigurationError, StepNotDefined
from .debounce import Debounce
from .definitions import OnException, StepDefinition, ordered_steps, with_name
from .fairness import Fairness
from .limits import Concurrency, RateLimit
from .schedules import Schedule
from .validation import validate_class


class AlreadyRegistered(ConfigurationError):
    """Two different workflow classes claim one ``name``."""


class NotRegistered(ConfigurationError):
    """No workflow class is registered under a name."""


class WorkflowRegistry:
    """Workflow classes by name. Defining a ``Workflow`` subclass registers it."""

    def __init__(self) -> None:
        self._registry: dict[str, type[DeclaredWorkflow]] = {}
        #: Classes first defined after the app registry was ready (not by autodiscovery, nor by
        #: an app's ``ready()``): a dispatcher, which imports only those, may not know them.
        self._late: set[str] = set()
        #: Changes whenever a class is registered or forgotten (what depends on the set of classes caches by it).
        self.version = 0

    def register(self, cls: type[DeclaredWorkflow]) -> None:
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

    def get(self, name: str) -> type[DeclaredWorkflow] | None:
        """The class registered under ``name``, or None when it is gone."""
        return self._registry.get(name)

    def classes(self) -> list[type[DeclaredWorkflow]]:
        """Every registered class, by name."""
        return [self._registry[name] for name in sorted(self._registry)]


registry = WorkflowRegistry()


def autodiscover() -> None:
    """Import the ``AUTODISCOVER_MODULE`` (default ``workflows``) of every installed app."""

    module = settings.AUTODISCOVER_MODULE
    if module:
        autodiscover_modules(module, register_to=registry)


class _StepNamespace(dict[str, Any]):
    """A class-body namespace that refuses a second step of one name."""

    def __init__(self, class_name: str) -> None:
        super().__init__()
        self.class_name = class_name

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, StepDefinition) and isinstance(self.get(key), StepDefinition):
            raise ConfigurationError(f"Step {key!r} is already defined in {self.class_name}")
        super().__setitem__(key, value)


class WorkflowMeta(type):
    """Collects the steps of a class body in order, validates them and registers the class."""

    @classmethod
    def __prepare__(cls, name: str, bases: tuple[type, ...], /, **kwargs: Any) -> MutableMapping[str, object]:
        return _StepNamespace(name)

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> WorkflowMeta:
        """Build the class with its steps (its parents' first), check it and register it unless it is abstract."""
        cls = super().__new__(mcs, name, bases, dict(namespace), **kwargs)
        own = [with_name(v, key) for key, v in namespace.items() if isinstance(v, StepDefinition)]
        base = next((b for b in bases if isinstance(b, WorkflowMeta)), None)
        for definition in own:
            setattr(cls, definition.name, definition)
        parent_steps: tuple[StepDefinition, ...] = getattr(cls, "_step_definitions", ())
        cls._step_definitions = ordered_steps(parent_steps, own)  # type: ignore[attr-defined]
        validate_class(cls)
        if not namespace.get("abstract", False) and base is not None:
            cls.name = namespace.get("name") or f"{cls.__module__}.{cls.__qualname__}"  # type: ignore[attr-defined]
            cls.name_given = bool(namespace.get("name"))  # type: ignore[attr-defined]
            registry.register(cls)  # type: ignore[arg-type]
        return cls


class DeclaredWorkflow(metaclass=WorkflowMeta):
    """The class-level half of ``Workflow``: what a subclass declares and what the engine looks up.

    Users subclass ``Workflow``, never this class; its attributes are documented there.
    """

    #: Stable name stored in rows; defaults to "module.QualName".
    name: ClassVar[str] = "pgbus_workflows.Workflow"
    #: Class-level exception policies, checked newest first after the step's own.
    exception_policies: ClassVar[list[OnException]] = []
    #: Default ``queue`` and ``priority`` for every step of the class.
    step_options: ClassVar[dict[str, Any]] = {}
    #: Allow several ongoing runs per subject.
    allow_multiple: ClassVar[bool] = False
    #: Collapse starts of one key into the run whose first step has not begun (``Debounce``).
    debounce: ClassVar[Debounce | None] = None
    #: At most ``limit`` steps of the runs sharing a key in progress at once (``Concurrency``).
    concurrency: ClassVar[Concurrency | None] = None
    #: At most ``limit`` steps of a key started per period (``RateLimit``).
    rate_limit: ClassVar[RateLimit | None] = None
    #: Claims take the due steps of several keys in turn, weighted (``Fairness``).
    fairness: ClassVar[Fairness | None] = None
    #: Keep going when the subject row was deleted (otherwise the run is cancelled).
    allow_missing_subject: ClassVar[bool] = False
    #: An abstract class is not registered; its subclasses are.
    abstract: ClassVar[bool] = True
    #: Signal names accepted although no step waits for them (a later version's, say).
    extra_signals: ClassVar[tuple[str, ...] | list[str]] = ()
    #: When runs start on their own (``Schedule(cron=...)`` or ``Schedule(every=...)``): the
    #: class's own list, not inherited; the dispatcher's leader syncs it to rows.
    schedules: ClassVar[list[Schedule] | tuple[Schedule, ...]] = ()
    #: True when the class body set ``name`` (else it is the dotted path: moving the module orphans runs).
    name_given: ClassVar[bool] = False
    _step_definitions: ClassVar[tuple[StepDefinition, ...]] = ()

    @classmethod
    def step_definitions(cls) -> tuple[StepDefinition, ...]:
        """The live step definitions, in order (gravestones left out)."""
        return tuple(s for s in cls._step_definitions if not s.removed)

    @classmethod
    def removed_step_names(cls) -> tuple[str, ...]:
        """The names kept by ``removed_step()`` gravestones."""
        return tuple(s.name for s in cls._step_definitions if s.removed)

    @classmethod
    def step_definition(cls, name: str) -> StepDefinition | None:
        """The definition (or gravestone) of ``name`` or of a step ``renamed_from`` it, or None."""
        found = next((s for s in cls._step_definitions if s.name == name), None)
        if found is None:
            found = next((s for s in cls._step_definitions if name in s.renamed_from), None)
        return found

    @classmethod
    def known_step_names(cls) -> frozenset[str]:
        """Every name a row of this class may hold that its code can run: steps, gravestones, old names."""
        return frozenset(n for s in cls._step_definitions for n in (s.name, *s.renamed_from))

    @classmethod
    def signal_names(cls) -> frozenset[str]:
        """The signal names the class accepts: every step's ``wait_for`` and ``extra_signals``."""
        return frozenset(n for s in cls._step_definitions for n in s.wait_for) | frozenset(cls.extra_signals)

    @classmethod
    def accepts_signal(cls, name: str) -> bool:
        """Whether a signal named ``name`` may be sent to a run of the class (:meth:`signal_names`)."""
        return name in cls.signal_names()

    @classmethod
    def require_step(cls, name: str) -> StepDefinition:
        """The live definition of ``name``; raises :class:`StepNotDefined` listing the steps."""
        definition = cls.step_definition(name)
        if definition is None or definition.removed:
            available = ", ".join(s.name for s in cls.step_definitions()) or "none"
            raise StepNotDefined(f"Step {name!r} is not defined in {cls.name}. Available steps: {available}")
        return definition

    @classmethod
    def next_step_after(cls, name: str | None) -> StepDefinition | None:
        """The live step after ``name`` (the first for None); gravestones are passed over."""
        names = [s.name for s in cls._step_definitions]
        if name is not None and name not in names:
            current = cls.step_definition(name)  # an old name continues after the renamed step
            name = current.name if current is not None else name
        start = 0 if name is None else (names.index(name) + 1 if name in names else len(names))
        return next((s for s in cls._step_definitions[start:] if not s.removed), None)
