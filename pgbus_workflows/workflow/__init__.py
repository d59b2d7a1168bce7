"""``Workflow``: the class users subclass (the DSL) and the handle on one run.

A class body declares steps; defining the class registers it. An instance wraps one
``WorkflowRun`` row: outside a step it is a handle with the operator verbs, inside a step
body (run by the executor) it also answers the step-only readers and verbs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Self, cast

from django.core.exceptions import ValidationError

from ..dsl.definitions import StepDefinition
from ..dsl.schedules import Schedule
from ..exceptions import ConfigurationError
from ..services.handle import RunHandle, handle_class
from .asynchronous import AsyncCalls
from .family import RunFamily
from .starter import Starter
from .verbs import RunVerbs

if TYPE_CHECKING:
    from django.db.models import Model, QuerySet

    from ..models import WorkflowEvent, WorkflowRun, WorkflowSchedule, WorkflowSignal


class _StepsAccessor:
    """``Cls.steps()`` gives the definitions; ``handle.steps`` the run's attempts, oldest first."""

    def __get__(self, instance: Workflow | None, owner: type[Workflow]) -> Any:
        if instance is None:
            return owner.step_definitions
        return instance.record.steps.order_by("id")


class Workflow(AsyncCalls, RunVerbs, RunFamily, RunHandle):
    """Subclass it, declare ``@step`` methods, call ``start()``. See the README.

    The class attributes a subclass may set (``name``, ``exception_policies``, ``step_options``,
    ``allow_multiple``, ``debounce``, ``allow_missing_subject``, ``abstract``, ``extra_signals``, ``schedules``)
    and the look-ups of its steps come from :class:`~pgbus_workflows.dsl.declared.DeclaredWorkflow`.
    """

    abstract = True

    def __init__(self, record: WorkflowRun, *, duplicate_start: bool = False, debounced: bool = False) -> None:
        super().__init__(record, duplicate_start=duplicate_start, debounced=debounced)
        self._outputs: dict[str, Any] | None = None

    steps = _StepsAccessor()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a step named after one of ``Workflow``'s own attributes: it would hide that attribute."""
        for key, value in vars(cls).items():
            if isinstance(value, StepDefinition) and hasattr(Workflow, key):
                raise ConfigurationError(
                    f"Step {key!r} in {cls.__name__} would hide Workflow.{key}: choose another name"
                )
        super().__init_subclass__(**kwargs)

    @classmethod
    def start(cls, subject: Model | None = None, *, idempotency_key: str | None = None, **arguments: Any) -> Self:
        """Start a run about ``subject`` with JSON ``arguments``; returns its handle.

        Raises :class:`AlreadyRunning` when the subject has an ongoing run; with an
        ``idempotency_key`` already used, returns the first run with ``duplicate_start``. A class
        with ``debounce`` returns the run of the same key whose first step has not begun, with
        these arguments and ``debounced`` set (see :class:`~pgbus_workflows.Debounce`).
        """
        from ..services.start import start_run  # deferred: this module loads before the app registry

        return cast(Self, start_run(cls, subject, idempotency_key=idempotency_key, arguments=arguments))

    @classmethod
    def started_by(cls, actor: str, reason: str | None = None) -> Starter[Self]:
        """Who starts runs and why: ``Cls.started_by("support:ann", reason="ticket 4411").start(user)``.

        The returned :class:`~pgbus_workflows.workflow.starter.Starter` has :meth:`start`,
        :meth:`astart` and :meth:`start_many`, which record ``actor`` and ``reason`` on each run's
        ``started`` event (shown by the admin, ``manage.py workflows show`` and the MCP tools);
        ``start()`` alone records the actor ``system``. Every keyword of ``start()`` stays the
        run's argument. A blank or too long actor, a reason over 2,000 characters, or a NUL
        character or lone surrogate in either raises ``ValueError``.
        """
        return Starter(cls, actor, reason)

    @classmethod
    def start_many(cls, items: Iterable[Model | Mapping[str, Any] | None]) -> list[Self]:
        """Start one run per item, in one transaction, with one ``INSERT`` per table; returns the handles.

        An item is a subject (a saved model instance, or None) or a mapping with any of
        ``subject``, ``idempotency_key`` and ``arguments``. The rules are :meth:`start`'s;
        when one item raises (bad input, :class:`AlreadyRunning`, :class:`IdempotencyConflict`),
        nothing of the call is written. For imports and backfills: chunk very long inputs.
        A class with ``debounce`` refuses it (``ConfigurationError``): start each run with :meth:`start`.
        """
        from ..services.start import start_runs  # deferred: this module loads before the app registry

        return cast(list[Self], start_runs(cls, items))

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
    def find(cls, workflow_id: Any) -> Self | None:
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
        handle = handle_for(record)
        return handle if isinstance(handle, cls) else None

    @classmethod
    def removed_steps_in_flight(cls) -> dict[str, int]:
        """``{removed step name: ongoing runs still on it}``; a gravestone can go at zero."""
        from ..services.deploys import removed_steps_in_flight  # deferred: this module loads before the app registry

        return removed_steps_in_flight(cls)

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

    # -- the handle ----------------------------------------------------------------------------

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
    def arguments(self) -> dict[str, Any]:
        """The JSON arguments given to ``start()``."""
        return self.record.arguments  # type: ignore[no-any-return]

    @property
    def outputs(self) -> dict[str, Any]:
        """Step name -> the output of its latest successful attempt.

        An attempt that ran under a name its step was renamed from (``renamed_from``) is under
        the step's name in this code, so a later step reads it by the name it knows.
        """
        if self._outputs is None:
            from ..models import WorkflowStep  # deferred: this module loads before the app registry

            rows = WorkflowStep.objects.filter(run_id=self.record.pk, outcome="success").order_by("id")
            current: dict[str, str] = {}  # each row's step name -> the step's name in this code
            outputs = {}
            for name, output in rows.values_list("step_name", "output"):
                if name not in current:
                    definition = type(self).step_definition(name)
                    current[name] = (definition.name if definition is not None else "") or name
                outputs[current[name]] = output
            self._outputs = outputs
        return self._outputs

    def fan_out_results(self, step_name: str) -> Iterator[Any]:
        """The job results of this run's latest fan-out ``step_name``, in job order (an iterator)."""
        from ..services.fanout import results  # deferred: this module loads before the app registry

        self.require_step(step_name)
        return results(self.record, step_name)

    def rerun(self, *, actor: str | None = None, reason: str | None = None) -> Self:
        """Start a new run of a finished or cancelled run's class, subject and arguments."""
        from ..services import operator  # deferred: this module loads before the app registry

        return cast(Self, handle_for(operator.rerun(self.record.pk, actor=actor, reason=reason)))

    def fork(self, from_step: str | None = None, *, actor: str | None = None, reason: str | None = None) -> Self:
        """Start a new run of this run's class, subject and arguments at ``from_step`` (the first step when None).

        The steps before ``from_step`` are not run again: the fork keeps the outputs of their
        latest successful attempts here (copied, linked by ``forked_from``).
        """
        from ..services import forking  # deferred: this module loads before the app registry

        return cast(Self, handle_for(forking.fork(self.record.pk, from_step, actor=actor, reason=reason)))

    @property
    def parent(self) -> Workflow | None:
        """The handle of the run whose fan-out started this one (None for a run started by code)."""
        if self.record.parent_id is None:
            return None
        parent = self.record.parent
        return None if parent is None else handle_for(parent)

    @property
    def children(self) -> list[Workflow]:
        """Handles of the runs this run's fan-outs started, in the order they were started."""
        from ..models import WorkflowRun  # deferred: this module loads before the app registry

        return [handle_for(run) for run in WorkflowRun.objects.filter(parent_id=self.record.pk).order_by("id")]


def handle_for(record: WorkflowRun) -> Workflow:
    """A handle of the run's registered class (the bare ``Workflow`` when that class is gone)."""
    # Every registered class that handle_class() accepts is a Workflow subclass: only Workflow's
    # subclasses are concrete (its bases set ``abstract``), and the registry holds no other.
    return cast("Workflow", handle_class(record.workflow_class, gone=Workflow)(record))
