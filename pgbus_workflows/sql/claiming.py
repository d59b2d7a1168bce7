"""The statements of the dispatcher's claims: due steps and jobs, the look-ahead, the re-check.

Registered in the same :data:`.statements.BUILDERS` as every other statement, and built with
the same helpers: names quoted by the backend, status values from the ``TextChoices``.
"""

from __future__ import annotations

from typing import Any

from ..models import FanOutJob, WorkflowRun, WorkflowStep
from ..states import JobStatus, RunStatus, StepStatus, job_event
from .statements import builds, columns, literal, table


@builds("due_steps")
def due_steps(conn: Any, queues: bool, unknown: int) -> str:
    """Due steps of ready runs by priority (the partial index ``pgbus_wf_step_due``), locked with their runs.

    ``queues``: whether an array of queue names follows (PostgreSQL; SQLite claims through
    the ORM); ``unknown``: how many ``(class, step name)`` pairs to leave out.
    """
    steps, runs = table(conn, WorkflowStep), table(conn, WorkflowRun)
    where = [
        f"s.status = {literal(StepStatus.SCHEDULED)}",
        "s.scheduled_at <= %s",
        f"r.status = {literal(RunStatus.READY)}",
    ]
    if queues:
        where.append("s.queue = ANY(%s)")
    if unknown:
        pairs = ", ".join(["(%s, %s)"] * unknown)
        where.append(f"(r.workflow_class, s.step_name) NOT IN (VALUES {pairs})")
    # Both rows locked, neither waited for (SKIP LOCKED: no lock order to keep), and both
    # re-read at their latest version when a transaction changed them since this snapshot.
    return (
        f"SELECT {columns(conn, WorkflowRun, 'r.')}, {columns(conn, WorkflowStep, 's.')} "
        f"FROM {steps} s JOIN {runs} r ON r.id = s.run_id WHERE {' AND '.join(where)} "
        "ORDER BY s.priority, s.scheduled_at, s.id LIMIT %s FOR UPDATE OF r, s SKIP LOCKED"
    )


@builds("steps_in_progress")
def steps_in_progress(conn: Any) -> str:
    """Which of an array of steps are still in progress (PostgreSQL)."""
    in_progress = literal(StepStatus.IN_PROGRESS)
    return f"SELECT id FROM {table(conn, WorkflowStep)} WHERE id = ANY(%s) AND status = {in_progress}"


@builds("due_jobs")
def due_jobs(conn: Any, queues: bool, unknown: bool) -> str:
    """Due pending jobs by priority (the partial index ``pgbus_wf_job_due``), locked (PostgreSQL).

    ``queues``: whether an array of queue names follows; ``unknown``: whether an array of
    function paths follows, left out while they are younger than a cutoff.
    """
    where = [f"status = {literal(JobStatus.PENDING)}", "scheduled_at <= %s"]
    if queues:
        where.append("queue = ANY(%s)")
    if unknown:
        where.append("NOT (function = ANY(%s) AND scheduled_at > %s)")
    return (
        f"SELECT id, function, scheduled_at FROM {table(conn, FanOutJob)} "
        f"WHERE {' AND '.join(where)} ORDER BY priority, scheduled_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
    )


@builds("start_jobs")
def start_jobs(conn: Any) -> str:
    """Move locked pending jobs to running, returning their rows (PostgreSQL)."""
    return (
        f"UPDATE {table(conn, FanOutJob)} j SET status = {literal(job_event('claim')[1])}, attempts = j.attempts + 1, "
        f"started_at = %s, claimed_by = %s, stall_at = %s + COALESCE(s.timeout, %s) FROM {table(conn, WorkflowStep)} s "
        f"WHERE j.id = ANY(%s) AND j.status = {literal(job_event('claim')[0])} AND s.id = j.step_id "
        f"RETURNING {columns(conn, FanOutJob, 'j.')}"
    )


@builds("commit_without_flush")
def commit_without_flush(conn: Any) -> str:
    """This transaction's commit does not wait for its WAL to reach the disk (PostgreSQL).

    For claims only: a claim lost in a server crash leaves its step scheduled, and it runs
    again, as a claim kept by the crash would (the attempt stalls, then reattempts).
    """
    return "SELECT set_config('synchronous_commit', 'off', true)"


@builds("commit")
def commit(conn: Any) -> str:
    """End the claim's own transaction in its write pipeline (PostgreSQL): one round trip less.

    Django's commit at the end of the ``atomic`` block then finds no transaction open and
    sends nothing (psycopg's ``commit()`` on an idle connection is a no-op).
    """
    return "COMMIT"


@builds("look_ahead")
def look_ahead(conn: Any, queues: bool) -> str:
    """When the loop must next look (PostgreSQL): the earliest future step or job, and whether a job is due now.

    Sent in the claim's pipeline, so it costs no round trip of its own. Placeholders: the
    claim's ``now``, then (``queues``) an array of queue names, both twice, for steps, then
    for jobs. Only what is due *after* ``now`` counts: a step due now that the claim passed
    over is held by another transaction (whose commit sends a ``NOTIFY``) or waits for newer
    code, and must not make the loop spin on it.
    """
    steps, runs, jobs = table(conn, WorkflowStep), table(conn, WorkflowRun), table(conn, FanOutJob)
    in_queues = " AND {}queue = ANY(%s)" if queues else ""
    pending = literal(JobStatus.PENDING)
    return (
        "SELECT LEAST("
        f"(SELECT MIN(s.scheduled_at) FROM {steps} s JOIN {runs} r ON r.id = s.run_id "
        f"WHERE s.status = {literal(StepStatus.SCHEDULED)} AND r.status = {literal(RunStatus.READY)} "
        f"AND s.scheduled_at > %s{in_queues.format('s.')}), "
        f"(SELECT MIN(scheduled_at) FROM {jobs} WHERE status = {pending} AND scheduled_at > %s{in_queues.format('')})"
        f"), EXISTS (SELECT 1 FROM {jobs} WHERE status = {pending} AND scheduled_at <= %s{in_queues.format('')})"
    )
