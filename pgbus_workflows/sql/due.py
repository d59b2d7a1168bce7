"""The due index as the claims read it: the due time it is keyed on, its priorities, the look-ahead.

The claims' due index (``pgbus_wf_step_due``) holds the scheduled attempts only, keyed on
(priority, ``held``, ``parked``, due time, id), where the due time is :func:`due_at`: an
attempt's ``scheduled_at`` while it is scheduled, NULL otherwise. A test of ``scheduled_at``
itself is estimated from the column's statistics, which cover the whole history: behind
10,000,000 finished runs, whose 30,000,000 attempts were all due in the past, PostgreSQL
expected nearly every one of 1,000,000 steps waiting days to be due, and read them all
through another index on every claim (0.7 s a claim). The expression has statistics of its
own (``pgbus_wf_step_due_at``, extended statistics on it, PostgreSQL 14+), made of the
scheduled attempts' due times alone, so a claim's due range is estimated as the few rows it
is, and read through the due index whatever the history; a prepared claim's generic plan,
made without the values, takes its range as small too (:func:`due_by`).
"""

from __future__ import annotations

from typing import Any

from ..models import FanOutJob, WorkflowRun, WorkflowStep
from ..states import JobStatus, RunStatus, StepStatus
from . import limiting
from .statements import column, literal, table


def due_by(conn: Any, alias: str, bound: str) -> str:
    """The step aliased ``alias`` is due at ``bound`` (a placeholder): a range of :func:`due_at`, bounded both ways.

    A dispatcher's claim is prepared, with a generic plan (``claiming.index_order_scans``):
    planned without ``bound``'s value, a one-sided test is taken to match a third of the
    scheduled steps, and the claim walked them all through ``pgbus_wf_one_active_step_per_run``
    instead (6 ms a claim behind 6,000 waiting steps, 0.7 s behind 1,000,000). A range bounded
    both ways is taken to match 0.5 % of them, and read through the due index.
    """
    return f"{due_at(conn, alias)} BETWEEN '-infinity' AND {bound}"


def due_after(conn: Any, alias: str, bound: str) -> str:
    """The step aliased ``alias`` is due after ``bound``: as :func:`due_by`, a range bounded both ways."""
    return f"{due_at(conn, alias)} > {bound} AND {due_at(conn, alias)} < 'infinity'"


def due_at(conn: Any, alias: str) -> str:
    """The due index's due time of the step aliased ``alias``: its ``scheduled_at`` while scheduled, else NULL.

    Written as the index and its statistics declare it (``WorkflowStep.Meta``, migration 0027),
    so PostgreSQL matches the one to the other; a claim's due range tests and orders by it.
    """
    status, at = column(conn, WorkflowStep, "status"), column(conn, WorkflowStep, "scheduled_at")
    return f"(CASE WHEN {alias}.{status} = {literal(StepStatus.SCHEDULED)} THEN {alias}.{at} END)"


def priorities(conn: Any, name: str, model: type[WorkflowStep] | type[FanOutJob]) -> str:
    """A recursive CTE ``name``: the priorities of the due-index rows of ``model``, lowest first (PostgreSQL).

    The scheduled steps (index ``pgbus_wf_step_due``, on (priority, ``held``, ``parked``, due
    time, id)) or the pending jobs (``pgbus_wf_job_due``, on (priority, ``scheduled_at``, id)). One
    column, ``priority``; a last NULL ends it; each priority is one descent of the index.
    PostgreSQL bounds a read of such an index by its due time only within one priority:
    read whole, it holds every row due later too, so the claims and the look-ahead read one
    range per priority.
    """
    rows = table(conn, model)
    status, priority = column(conn, model, "status"), column(conn, model, "priority")
    due = literal(StepStatus.SCHEDULED if model is WorkflowStep else JobStatus.PENDING)
    after = f"SELECT MIN(x.{priority}) FROM {rows} x WHERE x.{status} = {due} AND x.{priority} > p.priority"
    return (
        f"{name} AS (SELECT MIN({priority}) AS priority FROM {rows} WHERE {status} = {due} UNION ALL "
        f"SELECT ({after}) FROM {name} p WHERE p.priority IS NOT NULL)"
    )


def look_ahead(conn: Any, queues: bool) -> str:
    """When the loop must next look (PostgreSQL): the earliest future step or job, and whether a job is due now.

    Part of the claim's statement, so it costs no round trip of its own. It reads the CTEs
    ``priorities`` and ``job_priorities`` (:func:`priorities`), and in each priority's range
    of the due index the first step due later whose run is ready, the first job due later,
    and whether one is due now: a few index pages, however many wait for later.
    Placeholders: the claim's, ``now`` and (``queues``) ``queues``. Only what is due *after* ``now`` counts: a
    step due now that the claim passed over is held by another transaction (whose commit
    sends a ``NOTIFY``) or waits for newer code, and must not make the loop spin on it.
    """
    steps, runs, jobs = table(conn, WorkflowStep), table(conn, WorkflowRun), table(conn, FanOutJob)
    in_queues = " AND {}queue = ANY(%(queues)s)" if queues else ""
    pending = literal(JobStatus.PENDING)
    first_later = (
        f"SELECT s.scheduled_at FROM {steps} s WHERE s.status = {literal(StepStatus.SCHEDULED)} "
        "AND s.priority = p.priority AND NOT s.held AND NOT s.parked "
        f"AND {due_after(conn, 's', '%(now)s')}{in_queues.format('s.')} "
        f"AND (SELECT r.status FROM {runs} r WHERE r.id = s.run_id) = {literal(RunStatus.READY)} "
        f"ORDER BY {due_at(conn, 's')} LIMIT 1"
    )
    job_later = (
        f"SELECT scheduled_at FROM {jobs} WHERE status = {pending} AND priority = p.priority "
        f"AND scheduled_at > %(now)s{in_queues.format('')} ORDER BY scheduled_at LIMIT 1"
    )
    job_now = (
        f"SELECT 1 FROM {jobs} WHERE status = {pending} AND priority = p.priority "
        f"AND scheduled_at <= %(now)s{in_queues.format('')} LIMIT 1"
    )
    refill = f", {limiting.next_token(conn, '(SELECT at FROM limit_clock)', 'taken')}"
    return (
        "SELECT LEAST("
        f"(SELECT MIN(l.scheduled_at) FROM priorities p CROSS JOIN LATERAL ({first_later}) l), "
        f"(SELECT MIN(l.scheduled_at) FROM job_priorities p CROSS JOIN LATERAL ({job_later}) l){refill}"
        f"), EXISTS (SELECT 1 FROM job_priorities p CROSS JOIN LATERAL ({job_now}) l)"
    )
