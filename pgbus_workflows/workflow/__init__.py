"""``Workflow``: the class users subclass (the DSL) and the handle on one run.

A class body declares steps; defining the class registers it. An instance wraps one
``WorkflowRun`` row: outside a step it is a handle with the operator verbs, inside a step
body (run by the executor) it also answers the step-only readers and verbs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.exceptions import ValidationError

from ..dsl.declared import registry
from ..dsl.definitions import OnException, StepDefinition, ordered_steps, with_name
from ..dsl.schedules import Schedule
from ..dsl.validation import validate_class
from ..exceptions import ConfigurationError, StepNotDefined
from .body import StepContext
from .family import RunFamily
from .verbs import RunVerbs

if TYPE_CHECKING:
    from django.db.models import Model, QuerySet

    from ..models import WorkflowEvent, WorkflowRun, WorkflowSchedule, WorkflowSignal


class _StepNamespace(dict[str, Any]):
    """A class-body namespace that refuses a second step of one name."""

    def __init__(self, class_name: str) -> None:
        super().__init__()
        self.class_name = class_name

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, StepDefinition) and isinstance(self.get(key), StepDefinition):
            raise ConfigurationError(f"Step {key!r} is already defined in {self.class_name}")
        super().__setitem__(key, value)


class _StepsAccessor:
    """``Cls.steps()`` gives the definitions; ``handle.steps`` the run's attempts, oldest first."""

    def __get__(self, instance: Workflow | None, owner: type[Workflow]) -> Any:
        if instance is None:
            return owner.step_definitions
        return instance.record.steps.order_by("id")


class WorkflowMeta(type):
    """Collects the steps of a class body in order, validates them and registers the class."""

    @classmethod
    def __prepare__(cls, name: str, bases: tuple[type, ...], /, **kwargs: Any) -> MutableMapping[str, object]:
        return _StepNamespace(name)

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> WorkflowMeta:
        cls = super().__new__(mcs, name, bases, dict(namespace), **kwargs)
        own = [with_name(v, key) for key, v in namespace.items() if isinstance(v, StepDefinition)]
        base = next((b for b in bases if isinstance(b, WorkflowMeta)), None)
        for definition in own:
            if base is not None and hasattr(Workflow, definition.name):
                raise ConfigurationError(
                    f"Step {definition.name!r} in {name} would hide Workflow.{definition.name}: choose another name"
                )
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


class Workflow(RunVerbs, RunFamily, metaclass=WorkflowMeta):
    """Subclass it, declare ``@step`` methods, call ``start()``. See the README."""

    #: Stable name stored in rows; defaults to "module.QualName".
    name: ClassVar[str] = "pgbus_workflows.Workflow"
    #: Class-level exception policies, checked newest first after the step's own.
    exception_policies: ClassVar[list[OnException]] = []
    #: Default ``queue`` and ``priority`` for every step of the class.
    step_options: ClassVar[dict[str, Any]] = {}
    #: Allow several ongoing runs per subject.
    allow_multiple: ClassVar[bool] = False
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

    def __init__(self, record: WorkflowRun, *, duplicate_start: bool = False) -> None:
        self.record = record
        self.duplicate_start = duplicate_start
        self._context: StepContext | None = None
        self._subject_cache: tuple[Any] | None = None
        self._outputs: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.record.workflow_id} {self.record.status}>"

    # -- class level -------------------------------------------------------------------------

    @classmethod
    def step_definitions(cls) -> tuple[StepDefinition, ...]:
        """The live step definitions, in order (gravestones left out)."""
        return tuple(s for s in cls._step_definitions if not s.removed)

    steps = _StepsAccessor()

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

    @classmethod
    def start(cls, subject: Model | None = None, *, idempotency_key: str | None = None, **arguments: Any) -> Any:
        """Start a run about ``subject`` with JSON ``arguments``; returns its handle.

        Raises :class:`AlreadyRunning` when the subject has an ongoing run; with an
        ``idempotency_key`` already used, returns the first run with ``duplicate_start``.
        """
        from ..services.start import start_run  # deferred: this module loads before the app registry

        return start_run(cls, subject, idempotency_key=idempotency_key, arguments=arguments)

    @classmethod
    def start_many(cls, items: Iterable[Model | Mapping[str, Any] | None]) -> list[Any]:
        """Start one run per item, in one transaction, with one ``INSERT`` per table; returns the handles.

        An item is a subject (a saved model instance, or None) or a mapping with any of
        ``subject``, ``idempotency_key`` and ``arguments``. The rules are :meth:`start`'s;
        when one item raises (bad input, :class:`AlreadyRunning`, :class:`IdempotencyConflict`),
        nothing of the call is written. For imports and backfills: chunk very long inputs.
        """
        from ..services.start import start_runs  # deferred: this module loads before the app registry

        return start_runs(cls, items)

    @classmethod
    def add_schedule(
        cls,
        cron: str | None = None,
        *,
        every: timedelta | int | float | None = None,
        timezone: str = "UTC",
        arguments: dict[str, Any] | None = None,
        name: str | None = None,
        overlap: str = "skip",
        catchup: str = "latest",
        jitter: timedelta | int | float | None = None,
        enabled: bool = True,
        start_at: datetime | None = None,
        actor: str | None = None,
    ) -> WorkflowSchedule:
        """Add a schedule at run time (stored as a row, as the admin adds one); returns the row.

        The options are :class:`Schedule`'s; the first tick is the first after ``start_at``
        (default: now). Bad options raise :class:`ConfigurationError`; a name the class
        already has raises ``ValueError``.
        """
        from ..services.schedules import add_schedule  # deferred: this module loads before the app registry

        schedule = Schedule(
            cron,
            every=every,
            timezone=timezone,
            arguments=arguments,
            name=name,
            overlap=overlap,
            catchup=catchup,
            jitter=jitter,
            enabled=enabled,
        )
        return add_schedule(cls, schedule, start_at=start_at, actor=actor)

    @classmethod
    def find(cls, workflow_id: Any) -> Any:
        """The run with this workflow id as a handle of its class, or None.

        ``Workflow.find`` finds any run (a run whose class is gone loads as a bare
        ``Workflow``); a subclass finds only its own runs.
        """
        from ..models import WorkflowRun  # deferred: this module loads before the app registry

        try:
            record = WorkflowRun.objects.filter(workflow_id=workflow_id).first()
        except (ValidationError, ValueError, TypeError):  # a malformed UUID is simply not found
            return None
        if record is None:
            return None
        klass = registry.get(record.workflow_class) or Workflow
        return klass(record) if issubclass(klass, cls) else None

    @classmethod
    def removed_steps_in_flight(cls) -> dict[str, int]:
        """``{removed step name: ongoing runs still on it}``; a gravestone can go at zero."""
        from django.db.models import Count  # deferred: this module loads before the app registry

        from ..models import WorkflowRun  # deferred: this module loads before the app registry

        names = cls.removed_step_names()
        if not names:
            return {}
        rows = (
            WorkflowRun.objects.ongoing()
            .filter(workflow_class=cls.name, current_step__in=names)
            .values("current_step")
            .annotate(n=Count("pk"))
        )
        counts = {row["current_step"]: row["n"] for row in rows}
        return {name: counts.get(name, 0) for name in names}

    @classmethod
    def signal_for(
        cls,
        subject: Model,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
        missing: str = "raise",
        actor: str | None = None,
        reason: str | None = None,
    ) -> WorkflowSignal | None:
        """Signal the ongoing run of this class about ``subject`` (a webhook knows the order, not the run).

        With no ongoing run, ``missing="raise"`` raises :class:`NotOngoing` and
        ``missing="ignore"`` returns None. With several ongoing runs for the subject (a class with
        ``allow_multiple``) it raises ``ValueError`` and signals none, whatever ``missing`` says:
        which one was meant is unknown, so each is signalled through its handle. A subject-less
        run is signalled through its handle.
        """
        from ..exceptions import NotOngoing  # deferred: this module loads before the app registry
        from ..models import WorkflowRun  # deferred: this module loads before the app registry
        from ..services.payload import subject_reference  # deferred: this module loads before the app registry
        from ..services.signals import (  # deferred: this module loads before the app registry
            check_signal_input,
            check_signal_name,
            deliver_signal,
        )

        if missing not in ("raise", "ignore"):
            raise ValueError(f"missing must be 'raise' or 'ignore', got {missing!r}")
        check_signal_input(name, idempotency_key, actor)
        check_signal_name(cls, name)  # a typo raises even when no run is ongoing
        if subject is None:
            raise ValueError(
                f"{cls.name}.signal_for() needs a subject; signal a subject-less run through its handle "
                f"({cls.__name__}.find(workflow_id).signal(...))"
            )
        subject_type, subject_id = subject_reference(subject)
        runs = list(
            WorkflowRun.objects.ongoing().filter(workflow_class=cls.name).for_subject(subject_type, subject_id)[:2]
        )
        try:
            if not runs:
                raise NotOngoing(f"{cls.name} has no ongoing run for {subject_type} {subject_id}")
            if len(runs) > 1:
                raise ValueError(
                    f"{cls.name} has several ongoing runs for {subject_type} {subject_id} (allow_multiple): "
                    "signal one through its handle"
                )
            return deliver_signal(runs[0].pk, name, payload, idempotency_key, actor=actor, reason=reason)
        except NotOngoing:
            if missing == "raise":
                raise
            return None

    def cancel_if(self) -> bool:
        """Override to cancel the run before any step when it returns True."""
        return False

    # -- the handle ----------------------------------------------------------------------------

    @property
    def workflow_id(self) -> Any:
        """The run's public id (a UUID)."""
        return self.record.workflow_id

    @property
    def status(self) -> str:
        """The run's status as last loaded (``reload()`` refreshes it)."""
        return self.record.status

    @property
    def current_step(self) -> str:
        """The name of the run's active (or last) step."""
        return self.record.current_step

    @property
    def scheduled_for(self) -> datetime | None:
        """The tick a schedule started this run for (None for a run started otherwise)."""
        return self.record.scheduled_for

    @property
    def events(self) -> QuerySet[WorkflowEvent]:
        """The run's audit trail, oldest first."""
        return self.record.events.order_by("id")

    @property
    def signals(self) -> QuerySet[WorkflowSignal]:
        """Signals delivered to the run, oldest first."""
        return self.record.signals.order_by("id")

    @property
    def subject(self) -> Any:
        """The model instance the run is about (None when it had none or it was deleted)."""
        if self._subject_cache is None:
            from ..services.payload import load_subject  # deferred: this module loads before the app registry

            self._subject_cache = (load_subject(self.record.subject_type, self.record.subject_id),)
        return self._subject_cache[0]

    @property
    def arguments(self) -> dict[str, Any]:
        """The JSON arguments given to ``start()``."""
        return self.record.arguments  # type: ignore[no-any-return]

    @property
    def outputs(self) -> dict[str, Any]:
        """Step name -> the output of its latest successful attempt."""
        if self._outputs is None:
            from ..models import WorkflowStep  # deferred: this module loads before the app registry

            rows = WorkflowStep.objects.filter(run_id=self.record.pk, outcome="success").order_by("id")
            self._outputs = dict(rows.values_list("step_name", "output"))
        return self._outputs

    def fan_out_results(self, step_name: str) -> Iterator[Any]:
        """The job results of this run's latest fan-out ``step_name``, in job order (an iterator)."""
        from ..services.fanout import results  # deferred: this module loads before the app registry

        self.require_step(step_name)
        return results(self.record, step_name)


registry.fallback = Workflow
