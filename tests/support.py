"""Helpers the test files share: side effects, changed classes, running one step, a run's rows, the admin's URLs.

A test file keeps its workflow classes and the helpers only it needs; what several files
read or do the same way lives here, once. Every helper works on a run's handle (``wf``)
and reads the rows afresh.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.db import connection
from django.urls import reverse

from pgbus_workflows import Workflow
from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
from pgbus_workflows.services.claims import claim_step
from pgbus_workflows.services.executor import execute_step
from tests.testapp.models import SideEffect

# -- statements ----------------------------------------------------------------------------------


@contextmanager
def statements_sent() -> Iterator[list[str]]:
    """The texts of every execute Django's cursors make in the block, pipelined ones too, in order."""
    seen: list[str] = []

    def record(execute: Any, text: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(text)
        return execute(text, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


@contextmanager
def round_trips() -> Iterator[Callable[[], int]]:
    """How many times the connection waited for the server in the block (libpq's trace: each ReadyForQuery).

    A pipeline's sync and a plain statement are one each, however many statements a
    pipeline holds. Call the yielded function after the block.
    """
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        counted: list[int] = []
        try:
            yield lambda: counted[0]
        finally:
            pgconn.untrace()
            trace.seek(0)
            counted.append(sum("\tReadyForQuery" in line for line in trace if line.startswith("B")))


# -- locks ---------------------------------------------------------------------------------------


def sessions_waiting_for_a_lock(query_like: str = "", conn: Any = None) -> list[int]:
    """The pids of the other sessions on this database that wait for a lock now.

    ``query_like``: only those whose statement holds this text (an ``INSERT INTO`` a table...).
    Asked on ``conn`` (a psycopg connection in autocommit), else on Django's connection, which
    must be in autocommit too: a transaction keeps its first view of ``pg_stat_activity``.
    """
    sql = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND pid <> pg_backend_pid() AND position(%s in query) > 0"
    )
    if conn is not None:
        return [pid for (pid,) in conn.execute(sql, [query_like]).fetchall()]
    with connection.cursor() as cursor:
        cursor.execute(sql, [query_like])
        return [pid for (pid,) in cursor.fetchall()]


# -- side effects --------------------------------------------------------------------------------


def record(label: str, key: str = "") -> None:
    """Inside a body: note that it ran (``label``), with an optional ``key``, as a SideEffect row."""
    SideEffect.objects.create(label=label, key=key)


def labels() -> list[str]:
    """The labels of every SideEffect row, in the order they were written."""
    return list(SideEffect.objects.order_by("pk").values_list("label", flat=True))


# -- changing the code's classes ----------------------------------------------------------------------


@contextmanager
def changed_classes() -> Iterator[Callable[[Any, str, Any], None]]:
    """``change(target, name, value)`` sets an attribute of a workflow class until the block ends.

    Each change, and the undoing of them all, moves the registry's version on, as registering
    a class does: what is cached by it (``dsl.deploy``'s catalog and whether a class has
    fairness) is made again. Never back: a version put back by ``monkeypatch`` comes again when
    a later test registers a class, and a catalog cached under it without that class leaves
    its steps unclaimed.
    """
    with pytest.MonkeyPatch.context() as patch:

        def change(target: Any, name: str, value: Any) -> None:
            patch.setattr(target, name, value, raising=False)
            registry.version += 1

        yield change
    registry.version += 1


# -- running one step --------------------------------------------------------------------------------


def scheduled(wf: Workflow) -> WorkflowStep:
    """The run's scheduled attempt (a run has at most one active attempt)."""
    return WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled")


def run_next(wf: Workflow, claimed_by: str = "test") -> WorkflowStep:
    """Claim the run's scheduled attempt (due or not), execute it, reload ``wf``; returns the attempt row."""
    claimed = claim_step(scheduled(wf).pk, claimed_by)
    assert claimed is not None
    execute_step(claimed)
    wf.reload()
    return WorkflowStep.objects.get(pk=claimed.pk)


# -- reading a run's rows ---------------------------------------------------------------------------


def steps_of(wf: Workflow) -> list[WorkflowStep]:
    """The run's step attempts, oldest first."""
    return list(WorkflowStep.objects.filter(run_id=wf.record.pk).order_by("pk"))


def events_of(wf: Workflow, kind: str | None = None) -> list[WorkflowEvent]:
    """The run's events, oldest first (only those of ``kind`` when given)."""
    rows = WorkflowEvent.objects.filter(run_id=wf.record.pk).order_by("pk")
    if kind is not None:
        rows = rows.filter(kind=kind)
    return list(rows)


def kinds(wf: Workflow) -> list[str]:
    """The kinds of the run's events, oldest first."""
    return list(WorkflowEvent.objects.filter(run_id=wf.record.pk).order_by("pk").values_list("kind", flat=True))


def snapshot(wf: Workflow) -> tuple[Any, ...]:
    """What a refused or repeated call must leave alone: the run's rows, the row counts, the side effects."""
    pk = wf.record.pk
    return (
        WorkflowRun.objects.filter(pk=pk).values().get(),
        list(WorkflowStep.objects.filter(run_id=pk).order_by("pk").values()),
        list(WorkflowEvent.objects.filter(run_id=pk).order_by("pk").values_list("pk", flat=True)),
        list(WorkflowSignal.objects.filter(run_id=pk).order_by("pk").values()),
        WorkflowRun.objects.count(),
        WorkflowStep.objects.count(),
        labels(),
    )


def new_events(wf: Workflow, before: tuple[Any, ...]) -> list[WorkflowEvent]:
    """The run's events written after ``before`` (a :func:`snapshot`) was taken, oldest first."""
    return list(WorkflowEvent.objects.filter(run_id=wf.record.pk).exclude(pk__in=before[2]).order_by("pk"))


# -- the admin ------------------------------------------------------------------------------------

#: How far the engine's clock (the database's, read through ``clock.now()``: a reading
#: anchored by a round trip) may run ahead of this process's own when a test compares them.
CLOCK_SLACK = timedelta(milliseconds=100)

#: Every view permission of the app's models.
VIEW = ("view_workflowrun", "view_workflowstep", "view_workflowevent", "view_workflowsignal", "view_dispatcher")

#: What stands for a step's error text a user may not see: in the admin, in ``workflows show``, in MCP's ``show_run``.
WITHHELD = "Withheld: it may hold a step's error, shown with the permission to view workflow steps."


#: The password of every staff user the tests make (the browser tests log in with it).
PASSWORD = "correct horse battery staple"


def staff_user(django_user_model: Any, username: str, *codenames: str) -> Any:
    """A staff user holding exactly the app's permissions named by ``codenames``."""
    user = django_user_model.objects.create_user(username=username, password=PASSWORD, is_staff=True)
    perms = list(Permission.objects.filter(content_type__app_label="pgbus_workflows", codename__in=codenames))
    assert len(perms) == len(set(codenames))
    user.user_permissions.add(*perms)
    return user


def run_page(wf: Workflow) -> str:
    """The URL of the run's admin page."""
    return reverse("admin:pgbus_workflows_workflowrun_change", args=[wf.record.pk])


def operation_url(wf: Workflow, verb: str) -> str:
    """The URL of the admin's form for ``verb`` (pause, signal, resume_at...) on the run."""
    return reverse(f"admin:pgbus_workflows_workflowrun_{verb}", args=[wf.record.pk])


def messages_of(response: Any) -> list[tuple[int, str]]:
    """The (level, text) of every message the admin queued for the user during ``response``."""
    return [(m.level, str(m.message)) for m in get_messages(response.wsgi_request)]
