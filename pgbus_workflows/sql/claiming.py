"""The statements of the dispatcher's claims: due steps and jobs, the re-check, the stray holds.

Registered in the same :data:`.statements.BUILDERS` as every other statement, and built with
the same helpers: names quoted by the backend, status values from the ``TextChoices``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from ..models import FanOutJob, HoldKind, WorkflowEvent, WorkflowRun, WorkflowStep
from ..states import JobStatus, RunStatus, StepStatus, check_run_transition, job_event, step_event
from . import fairness, limiting
from .due import due_at, due_by, look_ahead, priorities
from .holding import held_names
from .statements import INDEX_PLANS, builds, column, columns, literal, pk, quote, table


@builds("claim_steps")
def claim_steps(conn: Any, queues: bool, unknown: int, without_flush: bool, fair: bool = False) -> str:
    """Claim due attempts of ready runs in one statement (PostgreSQL): locked, moved, recorded, looked past.

    The due steps are read priority by priority, lowest first (:func:`.due.priorities`), each
    priority's due range in the order of the partial index ``pgbus_wf_step_due`` (priority,
    ``held``, ``parked``, due time (:func:`.due.due_at`): a paused run's attempts, held, are
    past the range), and
    locked with their runs (each run by its primary key, in a lateral subquery, then the
    step): ``SKIP LOCKED`` never waits (no lock order to keep), and a row
    changed since the snapshot is re-read at its latest version. Those whose ``(class, step
    name)`` this process's catalog knows are claimed (the attempt ``in_progress``, the run
    ``performing``, a ``step_started`` event);
    the others stay as they are, locked until the commit, and are returned unclaimed so the
    caller learns to leave them out (``unknown``: how many such pairs it leaves out already).

    It also reads what the dispatcher's loop needs to know to sleep (:func:`.due.look_ahead`), and
    ``without_flush`` (a claim that is a transaction of its own, run in autocommit: one
    statement, one round trip) makes its commit not wait for the disk: a claim lost in a
    server crash leaves its step scheduled, and it runs again, as a claim kept by the crash
    would (the attempt stalls, then reattempts). Never inside a caller's transaction.

    A step under limits (``limiters`` not NULL) is claimed only while its limiter rows have
    room, taken in the same statement (``sql.limiting``): the rows decide, not this process's
    code, so a step stays claimable within its rows' limits after a deploy removes the
    declaration it was scheduled under. A step of a class without limits reads no limiter row.
    A step of a held class or on a held queue (``sql.holding``) is not claimed, nor locked.

    Placeholders, by name (:func:`claim_parameters` builds their mapping): ``now`` (the
    limiters' clock, the attempts' start and stall, the runs' move, the look-ahead's),
    ``due_by``, ``queues`` (when ``queues``: an array of queue names), ``limit`` (a
    priority's, the claim's, and how many due steps under limits to look at for parking),
    ``catalog`` (jsonb, ``{class: [step names]}``), ``claimed_by``, ``stall_threshold``, the
    ``unknown`` pairs (``unknown_class_<i>``, ``unknown_step_<i>``) and the event's columns
    but for its run and step (``event_<attname>``; its details merged after the attempt's number).
    Returns one row (nothing due) or one per locked step, read by :meth:`ClaimRow.read`.

    Parking (``sql.limiting.park``): of the first due steps under limits, those held back by
    a limiter with no room leave the due range (``parked``), so no claim walks a full key's
    waiting steps; each claim puts back the parked steps of keys with room again
    (``sql.limiting.unpark``), for the next claim to take.

    ``fair`` (a catalog with a class with ``Fairness``): each priority's due range is merged
    with its tagged steps in fair order (``sql.fairness.fair_priority``), and the steps are
    taken by place (``fair_at``, or an untagged step's due time); the steps of its keys that
    came due after a wait are placed (``sql.fairness.came_due``). Without it, the statement
    is the one of a catalog that never heard of fairness, to the byte.
    """
    steps, runs, events = table(conn, WorkflowStep), table(conn, WorkflowRun), table(conn, WorkflowEvent)
    ready, performing = RunStatus.READY, RunStatus.PERFORMING
    check_run_transition("claim", ready, performing)
    claimed = step_event("claim", StepStatus.SCHEDULED)

    def step_col(name: str) -> str:
        return column(conn, WorkflowStep, name)

    def run_col(name: str) -> str:
        return column(conn, WorkflowRun, name)

    where = [
        f"s.{step_col('status')} = {literal(StepStatus.SCHEDULED)}",
        f"NOT s.{step_col('held')}",  # a paused run's: after the claimable ones, never read
        "NOT s.parked",  # held back by a limit with no room: after them too, until put back
        due_by(conn, "s", "%(due_by)s"),  # estimated as the few steps it is, whatever the history (``sql.due``)
        f"s.{step_col('queue')} <> ALL({held_names(conn, HoldKind.QUEUE)})",  # an operator's hold
    ]
    if queues:
        where.append(f"s.{step_col('queue')} = ANY(%(queues)s)")
    of_run = [
        f"r.{pk(conn, WorkflowRun)} = s.{step_col('run')}",
        f"(r.{run_col('status')} = {literal(ready)}) IS TRUE",
        f"r.{run_col('workflow_class')} <> ALL({held_names(conn, HoldKind.CLASS)})",  # an operator's hold
    ]
    if unknown:  # left out before the lock: a run is locked only when its step may be claimed
        pairs = ", ".join(f"(%(unknown_class_{i})s, %(unknown_step_{i})s)" for i in range(unknown))
        of_run.append(f"(r.{run_col('workflow_class')}, s.{step_col('step_name')}) NOT IN (VALUES {pairs})")
    # Each step's run is read and locked by its primary key alone, whatever the statistics:
    # a subquery that locks is never merged into the join, and a status test no index can
    # serve (IS TRUE) leaves the primary key the one usable index. With the tables' statistics
    # from when they were nearly empty (vacuumed then, not analysed since), every index looks
    # as cheap, and a plain join scanned all the runs for each due step.
    # The run is locked only when the limiters have room: a held-back step's never is.
    of_run.append(limiting.may_claim(conn, "lim"))
    run = (
        f"SELECT r.{pk(conn, WorkflowRun)}, r.{run_col('workflow_class')} FROM {runs} r "
        f"WHERE {' AND '.join(of_run)} FOR UPDATE OF r SKIP LOCKED"
    )
    # One priority at a time, lowest first, each a range of the due index that ends at the
    # first step not due yet. Read whole, the index holds every step waiting for later too
    # (a drip campaign's waits of days), and a claim walked them all whenever fewer steps were
    # due than it could take. The limit outside stops the walk, and the locking, once it is met.
    at = "(SELECT at FROM limit_clock)"
    limits = (
        f", s.limiters, s.{step_col('priority')} AS priority, s.{step_col('scheduled_at')} AS scheduled_at, lim.room"
    )
    if fair:
        limits += f", s.{step_col('fair_at')} AS fair_at"
    lateral = f"CROSS JOIN LATERAL ({limiting.limiter_lateral(conn, at)}) lim "
    head = (
        f"SELECT s.{pk(conn, WorkflowStep)} AS step_key, r.{pk(conn, WorkflowRun)} AS run_key, "
        f"r.{run_col('workflow_class')} AS class_name, s.{step_col('step_name')} AS step_name{limits} "
        f"FROM {steps} s {lateral}CROSS JOIN LATERAL ({run}) r "
    )
    of_priority = (
        f"{head}WHERE s.{step_col('priority')} = p.priority AND {' AND '.join(where)} "
        f"ORDER BY {due_at(conn, 's')}, s.{pk(conn, WorkflowStep)} LIMIT %(limit)s FOR UPDATE OF s SKIP LOCKED"
    )
    if fair:
        in_fair_order = (
            f"{head}WHERE s.{step_col('priority')} = p.priority AND s.{step_col('fair_at')} IS NOT NULL "
            f"AND {' AND '.join(where)} ORDER BY s.{step_col('fair_at')}, s.{step_col('scheduled_at')}, "
            f"s.{pk(conn, WorkflowStep)} LIMIT %(limit)s FOR UPDATE OF s SKIP LOCKED"
        )
        of_priority = fairness.fair_priority(of_priority, in_fair_order, "%(limit)s")
    due = f"SELECT d.* FROM priorities p CROSS JOIN LATERAL ({of_priority}) d LIMIT %(limit)s"
    # Of the steps of one key, those past its room are left for a later claim.
    runnable = f"SELECT * FROM known WHERE step_key NOT IN ({limiting.over_room('known')})"
    timeout = step_col("timeout")
    attempts = (
        f"UPDATE {steps} s SET {step_col('status')} = {literal(claimed)}, {step_col('started_at')} = %(now)s, "
        f"{step_col('claimed_by')} = %(claimed_by)s, {step_col('stall_at')} = %(now)s + COALESCE(NULLIF(s.{timeout}, "
        f"interval '0'), %(stall_threshold)s) "
        f"WHERE s.{pk(conn, WorkflowStep)} = ANY(ARRAY(SELECT step_key FROM runnable)) "
        f"RETURNING {columns(conn, WorkflowStep, 's.')}"
    )
    moved = (
        f"UPDATE {runs} r SET {run_col('status')} = {literal(performing)}, {run_col('status_changed_at')} = %(now)s, "
        f"{run_col('paused_reason')} = '' WHERE r.{pk(conn, WorkflowRun)} = ANY(ARRAY(SELECT run_key FROM runnable)) "
        f"RETURNING {columns(conn, WorkflowRun, 'r.')}"
    )
    values = []
    for field in WorkflowEvent._meta.concrete_fields:
        if field.primary_key:
            continue
        if field.attname == "run_id":
            values.append(f"a.{step_col('run')}")
        elif field.attname == "step_id":
            values.append(f"a.{pk(conn, WorkflowStep)}")
        elif field.attname == "details":
            values.append(f"jsonb_build_object('attempt', a.{step_col('attempt')}) || %(event_details)s")
        else:
            values.append(f"%(event_{field.attname})s")
    names = ", ".join(quote(conn, f.column) for f in WorkflowEvent._meta.concrete_fields if not f.primary_key)
    started = f"INSERT INTO {events} ({names}) SELECT {', '.join(values)} FROM attempts a"
    # A volatile call keeps the CTE apart (evaluated once); it is selected so it is evaluated at all.
    flag = "set_config('synchronous_commit', 'off', true)" if without_flush else "NULL::text"
    ahead = f"SELECT {flag} AS flag, l.* FROM ({look_ahead(conn, queues)}) l(next_due_at, jobs_due)"
    # A class whose code runs any step name (``dsl.deploy.ANY_STEP``: a durable function) lists "*".
    known = "SELECT * FROM due WHERE (%(catalog)s::jsonb -> class_name) ?| ARRAY[step_name, '*']"
    head = ", ".join(f"{expression} AS {name}" for name, expression in _HEAD.items())
    return (
        "WITH RECURSIVE limit_clock AS (SELECT %(now)s::timestamptz AS at), "
        f"{priorities(conn, 'priorities', WorkflowStep)}, {priorities(conn, 'job_priorities', FanOutJob)}, "
        f"due AS ({due}), known AS ({known}), runnable AS ({runnable}), "
        f"taken AS ({limiting.take(conn, 'runnable', at)}), attempts AS ({attempts}), moved AS ({moved}), "
        f"started AS ({started}), {limiting.park(conn, at, 'due', limit='%(limit)s')}, {limiting.unpark(conn, at)}, "
        f"{fairness.came_due(conn, at, 'due', '%(limit)s') + ', ' if fair else ''}"
        f"ahead AS ({ahead}) "
        f"SELECT {head}, {columns(conn, WorkflowRun, 'm.')}, {columns(conn, WorkflowStep, 'a.')} "
        "FROM ahead LEFT JOIN due ON true "
        f"LEFT JOIN moved m ON m.{pk(conn, WorkflowRun)} = due.run_key "
        f"LEFT JOIN attempts a ON a.{pk(conn, WorkflowStep)} = due.step_key"
    )


#: The claim's result columns before the claimed run's and attempt's: name -> expression, in
#: :class:`ClaimRow`'s order (``tests/sql/test_sql.py`` holds the two together).
_HEAD = {
    "flag": "ahead.flag",  # set_config's value, read for its effect only
    "next_due_at": "ahead.next_due_at",
    "jobs_due": "ahead.jobs_due",
    "parked": "(SELECT count(*) FROM parked)",
    "put_back": "(SELECT count(*) FROM unparked)",
    "class_name": "due.class_name",
    "step_name": "due.step_name",
}


class ClaimRow(NamedTuple):
    """One row of :func:`claim_steps`' result, by name: the look-ahead, the parking, one locked step.

    The look-ahead's and the parking's values are the same on every row. A row without
    ``class_name`` says nothing was due; a row without ``run`` and ``step`` is a locked step
    left unclaimed (its key past its room in this claim, or its pair unknown to this process).
    """

    flag: str | None
    #: The earliest future step or job (``look_ahead``), None when nothing waits.
    next_due_at: datetime | None
    #: Whether a job is due now.
    jobs_due: bool
    #: How many held-back steps this claim parked.
    parked: int
    #: How many parked steps it put back.
    put_back: int
    #: The locked step's class (None: nothing was due).
    class_name: str | None
    #: The locked step's name.
    step_name: str | None
    #: The claimed run's columns (``WorkflowRun``'s concrete fields), None when left unclaimed.
    run: Sequence[Any] | None
    #: The claimed attempt's columns (``WorkflowStep``'s), None when left unclaimed.
    step: Sequence[Any] | None

    @classmethod
    def read(cls, row: Sequence[Any]) -> ClaimRow:
        """The named row of one result row, as :func:`claim_steps` selects its columns."""
        head = len(_HEAD)
        split = head + len(WorkflowRun._meta.concrete_fields)
        claimed = row[head] is not None  # the run's primary key
        return cls._make([*row[:head], row[head:split] if claimed else None, row[split:] if claimed else None])


def claim_parameters(
    *,
    now: datetime,
    due_by: datetime,
    queues: list[str] | None,
    limit: int,
    catalog: Any,
    claimed_by: str,
    stall_threshold: Any,
    unknown: Sequence[tuple[str, str]],
    event: dict[str, Any],
) -> dict[str, Any]:
    """The mapping of :func:`claim_steps`' named placeholders (``event``: ``{attname: prepared value}``)."""
    params: dict[str, Any] = {
        "now": now,
        "due_by": due_by,
        "limit": limit,
        "catalog": catalog,
        "claimed_by": claimed_by,
        "stall_threshold": stall_threshold,
    }
    if queues is not None:
        params["queues"] = queues
    for index, (class_name, step_name) in enumerate(unknown):
        params[f"unknown_class_{index}"], params[f"unknown_step_{index}"] = class_name, step_name
    params.update({f"event_{attname}": value for attname, value in event.items()})
    return params


@builds("index_order_scans")
def index_order_scans(conn: Any) -> str:
    """A claim's plans, for the rest of its transaction: on indexes, never compiled, never made anew (PostgreSQL).

    See ``sql.fetch_in_index_order`` and :data:`.statements.INDEX_PLANS` (``transaction_id``
    may set those for the rest of its transaction). A prepared claim keeps its generic plan
    (its shape holds whatever the statistics, see :func:`claim_steps`). PostgreSQL's own
    choice went to a plan made for each claim's values once many steps wait for later: it
    saw ``now`` before all of them, a plan much cheaper than the generic one by its
    estimate, and planned every claim anew (1.5 ms a claim behind 200,000 such steps, where
    the claim itself ran in 0.6 ms).
    """
    return f"SELECT {INDEX_PLANS}, set_config('plan_cache_mode', 'force_generic_plan', true)"


@builds("steps_in_progress")
def steps_in_progress(conn: Any) -> str:
    """Which of an array of steps are still in progress (PostgreSQL)."""
    in_progress = literal(StepStatus.IN_PROGRESS)
    return f"SELECT id FROM {table(conn, WorkflowStep)} WHERE id = ANY(%s) AND status = {in_progress}"


@builds("due_jobs")
def due_jobs(conn: Any, queues: bool, unknown: bool) -> str:
    """Due pending jobs by priority (the partial index ``pgbus_wf_job_due``), locked (PostgreSQL).

    Read a priority at a time, as the steps' claim reads them (:func:`priorities`): jobs
    backing off after failures wait in the same index. Placeholders: now; (``queues``) an
    array of queue names; (``unknown``) an array of function paths, left out while they are
    younger than the cutoff that follows; the limit, twice (a priority's, the claim's).
    """
    where = [f"status = {literal(JobStatus.PENDING)}", "scheduled_at <= %s"]
    if queues:
        where.append("queue = ANY(%s)")
    if unknown:
        where.append("NOT (function = ANY(%s) AND scheduled_at > %s)")
    of_priority = (
        f"SELECT id, function, scheduled_at FROM {table(conn, FanOutJob)} WHERE priority = p.priority AND "
        f"{' AND '.join(where)} ORDER BY scheduled_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    return (
        f"WITH RECURSIVE {priorities(conn, 'priorities', FanOutJob)} "
        f"SELECT d.* FROM priorities p CROSS JOIN LATERAL ({of_priority}) d LIMIT %s"
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


@builds("stray_holds")
def stray_holds(conn: Any) -> str:
    """Held scheduled attempts whose run is not paused (PostgreSQL): ``(step key, run key)`` rows.

    Read a priority at a time (:func:`priorities`), each priority's held range of the due
    index, so the read grows with the held attempts only. Placeholders: the limit, twice.
    """
    steps, runs = table(conn, WorkflowStep), table(conn, WorkflowRun)
    of_priority = (
        f"SELECT s.id, s.run_id FROM {steps} s WHERE s.status = {literal(StepStatus.SCHEDULED)} "
        "AND s.priority = p.priority AND s.held "
        f"AND (SELECT r.status FROM {runs} r WHERE r.id = s.run_id) <> {literal(RunStatus.PAUSED)} LIMIT %s"
    )
    return (
        f"WITH RECURSIVE {priorities(conn, 'priorities', WorkflowStep)} "
        f"SELECT h.* FROM priorities p CROSS JOIN LATERAL ({of_priority}) h LIMIT %s"
    )
