"""System checks for deploys: run ``manage.py check --database default`` before and after one.

Without ``--database`` only the class check runs (no query). With it, the checks compare the
rows with this process's code and say, with counts and what to do: ongoing runs on classes
or steps the code does not define, runs parked on gravestones, pending signals that no step
of their class waits for, queues with due steps that no live dispatcher serves, and functions
bearing the name of ``start()``'s that the tables' owner does not own. On a database without
the app's tables (a fresh one: ``migrate`` runs these checks before it makes them) there are
no rows to compare, and they say nothing.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Info, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import DatabaseError, connections
from django.db.models import Count

from .conf import settings
from .dsl.declared import registry
from .dsl.deploy import knows_step
from .models import Dispatcher, SignalStatus, WorkflowRun, WorkflowSchedule, WorkflowSignal, WorkflowStep
from .services.deploys import removed_steps_in_flight
from .sql import clock, functions
from .states import ACTIVE_STEP, ONGOING_RUN, RunStatus, StepStatus


@register(Tags.compatibility)
def check_class_names(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A class without ``name`` stores its dotted path: moving its module orphans its runs."""
    return [
        CheckWarning(
            f"Workflow class {cls.__module__}.{cls.__qualname__} has no `name`: its runs store {cls.name!r}, "
            "so moving or renaming the module or the class orphans them.",
            hint=f'Set name = "{cls.__qualname__.lower()}" (any stable string) on the class; '
            "keep the dotted path as its value if runs already exist.",
            obj=cls,
            id="pgbus_workflows.W004",
        )
        for cls in registry.classes()
        if not cls.name_given
    ]


@register(Tags.database)
def check_rows_against_code(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """What the rows hold that this code cannot run (``check --database default``)."""
    if not databases or "default" not in databases:
        return []
    try:
        if WorkflowRun._meta.db_table not in connections["default"].introspection.table_names():
            return []  # a fresh database, `migrate` about to make the tables: no rows yet, nothing to compare
        return [
            *_unknown_runs(),
            *_gravestones(),
            *_unknown_signals(),
            *_unserved_queues(),
            *_unknown_schedules(),
            *_foreign_start_functions(),
        ]
    except DatabaseError as error:  # unreachable or not migrated: say so, do not crash `check`
        return [
            CheckWarning(
                f"pgbus_workflows could not compare the database with the code: {str(error).strip()}",
                hint="Is the database reachable, and migrated (`python manage.py migrate`)?",
                id="pgbus_workflows.W005",
            )
        ]


def _active_steps() -> Any:

    return WorkflowStep.objects.filter(status__in=ACTIVE_STEP, run__status__in=ONGOING_RUN)


def _unknown_runs() -> list[CheckMessage]:

    messages: list[CheckMessage] = []
    ongoing = WorkflowRun.objects.ongoing().values_list("workflow_class").annotate(n=Count("pk")).order_by()
    for name, count in sorted(ongoing):
        if registry.get(name) is None:
            messages.append(
                CheckWarning(
                    f"{count} ongoing run(s) of workflow class {name!r}, which this code does not define.",
                    hint="Deploy the code that defines it (dispatchers leave its steps alone, then pause them "
                    "after UNKNOWN_STEP_GRACE), or cancel the runs in the admin (filter by class).",
                    id="pgbus_workflows.W006",
                )
            )
    steps = _active_steps().values_list("run__workflow_class", "step_name").annotate(n=Count("pk")).order_by()
    for name, step_name, count in sorted(steps):
        cls = registry.get(name)
        if cls is not None and not knows_step(cls.known_step_names(), step_name):
            messages.append(
                CheckWarning(
                    f"{count} ongoing run(s) of {name} are on step {step_name!r}, which the class does not define.",
                    hint=f"Keep the name as `{step_name} = removed_step()` (the runs skip on) or rename with "
                    f'@step(renamed_from="{step_name}") (they continue on that step); or resume_at() another step.',
                    id="pgbus_workflows.W007",
                )
            )
    return messages


def _gravestones() -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for cls in registry.classes():
        parked = {name: n for name, n in removed_steps_in_flight(cls).items() if n}
        if parked:
            listed = ", ".join(f"{name} ({n})" for name, n in sorted(parked.items()))
            messages.append(
                Info(
                    f"{sum(parked.values())} ongoing run(s) of {cls.name} are on removed steps: {listed}.",
                    hint="Dispatchers move them on to the next step (a waiting one at the next sweep). Keep each "
                    "removed_step() until Cls.removed_steps_in_flight() says 0, then delete it.",
                    id="pgbus_workflows.I001",
                )
            )
    return messages


def _unknown_signals() -> list[CheckMessage]:

    pending = (
        WorkflowSignal.objects.filter(status=SignalStatus.PENDING, run__status__in=ONGOING_RUN)
        .values_list("run__workflow_class", "name")
        .annotate(n=Count("pk"))
        .order_by()
    )
    messages: list[CheckMessage] = []
    for name, signal_name, count in sorted(pending):
        cls = registry.get(name)
        if cls is not None and not cls.accepts_signal(signal_name):
            messages.append(
                CheckWarning(
                    f"{count} pending signal(s) {signal_name!r} for runs of {name}, whose steps never wait for it.",
                    hint="A typo or a step that was removed: they stay pending for ever. Wait for the name in a "
                    "step (wait_for=) or list it in extra_signals; fix the sender.",
                    id="pgbus_workflows.W008",
                )
            )
    return messages


def _unserved_queues() -> list[CheckMessage]:

    now = clock.now()
    alive = Dispatcher.objects.filter(heartbeat_at__gte=now - settings.DISPATCHER_DEAD_AFTER)
    served: set[str] = set()
    for queues in alive.values_list("queues", flat=True):
        if not queues:
            return []  # a dispatcher serving every queue
        served.update(queues)
    due = (
        _active_steps()
        .filter(status=StepStatus.SCHEDULED, held=False, scheduled_at__lte=now, run__status=RunStatus.READY)
        .values_list("queue")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return [
        CheckWarning(
            f"{count} due step(s) in queue {queue!r}, which no live dispatcher serves.",
            hint=f"Start one: python manage.py run_workflow_dispatcher --queue {queue} (or one with no --queue).",
            id="pgbus_workflows.W009",
        )
        for queue, count in sorted(due)
        if queue not in served
    ]


def _unknown_schedules() -> list[CheckMessage]:
    """Schedules of classes this code does not define: no leader running this code fires them."""
    known = [cls.name for cls in registry.classes()]
    rows = (
        WorkflowSchedule.objects.filter(enabled=True, paused=False)
        .exclude(workflow_class__in=known)
        .values_list("workflow_class")
        .annotate(n=Count("pk"))
        .order_by("workflow_class")
    )
    return [
        CheckWarning(
            f"{n} schedule(s) of workflow class {klass!r}, which this code does not define: "
            "a schedule leader running this code does not fire them.",
            hint="Deploy the code that defines the class, or pause or delete its schedules in the admin.",
            id="pgbus_workflows.W010",
        )
        for klass, n in rows
    ]


def _foreign_start_functions() -> list[CheckMessage]:
    """Functions bearing the name of ``start()``'s that the tables' owner does not own: never called, maybe planted."""
    return [
        CheckWarning(
            f"The function {function} bears the name of start()'s functions, but the runs table's owner does not "
            "own it: start() never calls it.",
            hint="A role that may create objects in its schema could have planted it: drop it (DROP FUNCTION) and "
            "revoke CREATE on that schema from PUBLIC.",
            id="pgbus_workflows.W011",
        )
        for function in functions.foreign()
    ]
