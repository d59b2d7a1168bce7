"""The statements of ``Concurrency`` and ``RateLimit``: the limiter rows, and what the claim adds to take them.

A step under limits stores the names of its limiter rows (``WorkflowStep.limiters``, jsonb).
The claim (``claiming.claim_steps``) locks a due step's limiter rows that
have room, ``FOR UPDATE SKIP LOCKED``, before it locks the step's run: a row changed since
the claim's snapshot is re-read at its latest version, so the room it sees is the room
committed by every other claim and outcome. Steps of one key in one claim are ranked, and
those past the room are left; the claim then takes the slots and spends the tokens of the
steps it claims, in the same statement. The outcome's transaction gives the slots back
(:func:`release_slots`), and sends a ``NOTIFY`` so a held-back step is claimed at once.

Registered in the same :data:`.statements.BUILDERS` as every other statement.
"""

from __future__ import annotations

from typing import Any

from ..dsl.limits import CONCURRENCY
from ..models import WorkflowLimiter, WorkflowStep
from ..states import StepStatus
from .statements import builds, column, literal, table


def _refilled(conn: Any, alias: str, at: str) -> str:
    """A bucket's tokens at ``at``: what it held, plus ``limit`` per ``per`` since, up to ``limit``.

    A bucket's clock never goes back: a claim whose ``now`` was read before another's that
    locked the bucket first adds nothing (``GREATEST``), and leaves ``refilled_at`` where it is.
    """
    limit = f"{alias}.{column(conn, WorkflowLimiter, 'limit')}"
    return (
        f"LEAST({limit}, {alias}.tokens + EXTRACT(EPOCH FROM GREATEST({at} - {alias}.refilled_at, interval '0')) "
        f"* {limit} / EXTRACT(EPOCH FROM {alias}.per))"
    )


def room(conn: Any, alias: str, at: str) -> str:
    """How many more steps the limiter row ``alias`` lets start at ``at`` (a slot count, or whole tokens)."""
    limit, in_use = column(conn, WorkflowLimiter, "limit"), column(conn, WorkflowLimiter, "in_use")
    refilled = _refilled(conn, alias, at)
    return f"(CASE WHEN {alias}.per IS NULL THEN {alias}.{limit} - {alias}.{in_use} ELSE floor({refilled}) END)"


def limiter_lateral(conn: Any, at: str) -> str:
    """A lateral subquery of a due step ``s``: its limiter rows with room, locked, and the room of each.

    ``n``: how many of them (the step may be claimed when ``n`` is the number it names);
    ``room``: jsonb ``{name: room}``. For a step with no limiters, nothing is read.
    """
    limiters = table(conn, WorkflowLimiter)
    names = "ARRAY(SELECT jsonb_array_elements_text(s.limiters))"
    locked = (
        f"SELECT l.name, {room(conn, 'l', at)} AS room FROM {limiters} l "
        f"WHERE s.limiters IS NOT NULL AND l.name = ANY({names}) AND {room(conn, 'l', at)} >= 1 "
        "FOR UPDATE OF l SKIP LOCKED"
    )
    return f"SELECT count(*) AS n, jsonb_object_agg(g.name, g.room) AS room FROM ({locked}) g"


def may_claim(conn: Any, lateral: str) -> str:
    """The test that each of a step's limiter rows has room, and no parked step of its keys comes before it.

    True for a step with no limiters. Rows the lateral left out (no room, or locked by another
    claim) are those that exist with no room to give it: a name whose row is gone (deleted by
    an operator) limits nothing, so a step under it is never stranded. Counted only when the
    lateral left one out (``OR`` stops at the first true). A step of a key whose earlier steps
    are parked waits for them (:func:`unpark` puts them back first, in priority and due order).
    """
    names = "ARRAY(SELECT jsonb_array_elements_text(s.limiters))"
    existing = f"(SELECT count(*) FROM {table(conn, WorkflowLimiter)} e WHERE e.name = ANY({names}))"
    whole = f"{lateral}.n = jsonb_array_length(s.limiters)"
    earlier = (
        f"SELECT 1 FROM {table(conn, WorkflowStep)} p WHERE {_parked('p')} AND p.parked_on = ANY({names}) "
        "AND (p.priority, p.scheduled_at, p.id) < (s.priority, s.scheduled_at, s.id)"
    )
    return f"(s.limiters IS NULL OR (({whole} OR {lateral}.n = {existing}) AND NOT EXISTS ({earlier})))"


def _parked(alias: str) -> str:
    """The predicate of the parked index (``pgbus_wf_step_parked``) on the steps ``alias``."""
    return f"{alias}.status = {literal(StepStatus.SCHEDULED)} AND {alias}.parked"


def park(conn: Any, at: str, exclude: str | None = None, limit: str = "%s") -> str:
    """CTEs ``park_rows`` and ``parked``: the held-back steps among the first due steps under limits, parked.

    ``limit``: the placeholder of how many of them to read (a named one in a statement of named placeholders).

    Read in due order through the partial index of unparked scheduled steps under limits
    (``pgbus_wf_step_limited``), at most that many: a claim's cost stays bounded whatever
    waits. A step is parked on its first limiter with no room, locked ``FOR SHARE`` (the room
    read again at its latest version): an outcome that gives a slot back waits for the park to
    commit, so the claim its ``NOTIFY`` wakes sees the step parked and puts it back
    (:func:`unpark`). ``SKIP LOCKED`` throughout: a claim never waits. ``exclude``: a CTE of
    the steps this statement claims or passed over with room (``step_key``).
    """
    steps, limiters = table(conn, WorkflowStep), table(conn, WorkflowLimiter)
    names = "ARRAY(SELECT jsonb_array_elements_text(x.limiters))"
    left_out = f" AND y.id NOT IN (SELECT step_key FROM {exclude})" if exclude else ""
    first = (
        f"SELECT y.id FROM {steps} y WHERE y.status = {literal(StepStatus.SCHEDULED)} AND y.limiters IS NOT NULL "
        f"AND NOT y.held AND NOT y.parked AND y.scheduled_at <= {at}{left_out} ORDER BY y.scheduled_at LIMIT {limit}"
    )
    full = (
        f"SELECT l.name FROM {limiters} l WHERE l.name = ANY({names}) AND {room(conn, 'l', at)} < 1 "
        "ORDER BY l.name LIMIT 1 FOR SHARE OF l SKIP LOCKED"
    )
    # Rows found by their keys, one pass of the primary key for the whole array, whatever the
    # statistics say of the table: a test no index can serve (IS TRUE) keeps the due index out,
    # and each step's limiter is looked up in one jsonb object, not by a join (a batch of
    # thousands compared each row with the whole array).
    locked = (
        f"SELECT x.id, f.name FROM {steps} x CROSS JOIN LATERAL ({full}) f "
        f"WHERE x.id = ANY(ARRAY({first})) AND (x.status = {literal(StepStatus.SCHEDULED)} AND NOT x.parked) IS TRUE "
        "FOR UPDATE OF x SKIP LOCKED"
    )
    held = f"SELECT jsonb_object_agg(h.id::text, h.name) AS names FROM ({locked}) h"
    names = "(SELECT names FROM park_rows)"
    update = (
        f"UPDATE {steps} s SET parked = true, parked_on = {names} ->> s.id::text "
        f"WHERE s.id = ANY(ARRAY(SELECT jsonb_object_keys({names})::bigint)) RETURNING s.id"
    )
    return f"park_rows AS ({held}), parked AS ({update})"


def unpark(conn: Any, at: str) -> str:
    """CTEs ``parked_keys`` and ``unparked``: the parked steps of keys with room put back, a key's first ``room``.

    The keys are read one descent of the parked index (``pgbus_wf_step_parked``) each, and
    each key's steps in priority then due order: its earliest are claimed first. A key whose
    limiter row is gone limits nothing: all of its steps are put back. Steps put back are
    claimed by the next claim (this statement's snapshot does not see them). Steps an
    operator's hold parked (``hold:...``, ``sql.holding``) are put back by its release alone.
    """
    steps, limiters = table(conn, WorkflowStep), table(conn, WorkflowLimiter)
    after = f"SELECT MIN(x.parked_on) FROM {steps} x WHERE {_parked('x')}"
    keys = (
        f"parked_keys AS (SELECT ({after}) AS name UNION ALL "
        f"SELECT ({after} AND x.parked_on > k.name) FROM parked_keys k WHERE k.name IS NOT NULL)"
    )
    has_room = f"SELECT k.name, ({room(conn, 'l', at)})::bigint AS room FROM parked_keys k "
    has_room += f"LEFT JOIN {limiters} l ON l.name = k.name WHERE k.name IS NOT NULL "
    has_room += f"AND (l.name IS NULL OR {room(conn, 'l', at)} >= 1) AND left(k.name, 5) <> 'hold:'"
    first = (
        f"SELECT x.id FROM {steps} x WHERE {_parked('x')} AND x.parked_on = k.name "
        "ORDER BY x.priority, x.scheduled_at, x.id LIMIT k.room FOR UPDATE OF x SKIP LOCKED"
    )
    put_back = (
        f"UPDATE {steps} s SET parked = false, parked_on = '' "
        f"WHERE s.id = ANY(ARRAY(SELECT f.id FROM ({has_room}) k CROSS JOIN LATERAL ({first}) f)) RETURNING s.id"
    )
    return f"{keys}, unparked AS ({put_back})"


@builds("park_held_back")
def park_held_back(conn: Any) -> str:
    """Park held-back steps among the first due steps under limits, how many (PostgreSQL; :func:`park`).

    Placeholders: now, how many to read.
    """
    at = "(SELECT at FROM limit_clock)"
    return f"WITH limit_clock AS (SELECT %s::timestamptz AS at), {park(conn, at)} SELECT count(*) FROM parked"


def over_room(runnable_of: str) -> str:
    """The steps of ``runnable_of`` (a CTE of due steps) past their keys' room, ranked by priority and due time."""
    ranked = (
        "SELECT x.step_key, row_number() OVER (PARTITION BY k.name ORDER BY x.priority, x.scheduled_at, x.step_key) "
        "AS n, min((x.room ->> k.name)::numeric) OVER (PARTITION BY k.name) AS room "
        f"FROM {runnable_of} x CROSS JOIN LATERAL jsonb_array_elements_text(x.limiters) k(name)"
    )
    return f"SELECT ranked.step_key FROM ({ranked}) ranked WHERE ranked.n > ranked.room"


def take(conn: Any, claimed: str, at: str) -> str:
    """Take a slot, or spend a token, for each limiter of each step in ``claimed`` (a CTE with ``limiters``)."""
    limiters, limit = table(conn, WorkflowLimiter), column(conn, WorkflowLimiter, "limit")
    in_use = column(conn, WorkflowLimiter, "in_use")
    left = f"({_refilled(conn, 'l', at)} - c.n)"
    counts = (
        f"SELECT k.name, count(*) AS n FROM {claimed} r "
        "CROSS JOIN LATERAL jsonb_array_elements_text(r.limiters) k(name) GROUP BY k.name"
    )
    return (
        f"UPDATE {limiters} l SET {in_use} = CASE WHEN l.per IS NULL THEN l.{in_use} + c.n ELSE l.{in_use} END, "
        f"tokens = CASE WHEN l.per IS NULL THEN l.tokens ELSE {left} END, "
        f"refilled_at = CASE WHEN l.per IS NULL THEN l.refilled_at ELSE GREATEST(l.refilled_at, {at}) END, "
        f"available_at = CASE WHEN l.per IS NULL OR {left} >= 1 THEN NULL "
        f"ELSE GREATEST(l.refilled_at, {at}) + l.per * ((1 - {left}) / l.{limit}) END "
        f"FROM ({counts}) c WHERE l.name = c.name RETURNING l.available_at"
    )


def next_token(conn: Any, at: str, taken: str) -> str:
    """The earliest time after ``at`` an emptied bucket has a token again (the loop's look-ahead).

    Of the buckets this claim emptied (``taken``, the CTE of :func:`take`: the claim's own
    snapshot does not see its writes) and of those emptied before.
    """
    before = f"SELECT MIN(available_at) FROM {table(conn, WorkflowLimiter)} WHERE available_at > {at}"
    return f"LEAST(({before}), (SELECT MIN(available_at) FROM {taken} WHERE available_at > {at}))"


@builds("ensure_limiters")
def ensure_limiters(conn: Any) -> str:
    """Make the limiter rows of a step being scheduled, and write a changed declaration's limit (PostgreSQL).

    An existing row is not locked unless its limit or period changed (``DO NOTHING``, then an
    ``UPDATE`` of only the rows that differ): scheduling a step of a busy key never waits on
    the claims that hold its row. Placeholders: arrays of names, kinds, limits and periods
    (NULL for a concurrency limit), then now.
    """
    limiters, limit = table(conn, WorkflowLimiter), column(conn, WorkflowLimiter, "limit")
    in_use = column(conn, WorkflowLimiter, "in_use")
    given = "SELECT * FROM unnest(%s::text[], %s::text[], %s::integer[], %s::interval[]) AS v(name, kind, lim, per)"
    return (
        f"WITH v AS ({given}), clock AS (SELECT %s::timestamptz AS at), "
        f"made AS (INSERT INTO {limiters} (name, kind, {limit}, {in_use}, per, tokens, refilled_at, created_at) "
        "SELECT v.name, v.kind, v.lim, 0, v.per, CASE WHEN v.per IS NULL THEN NULL ELSE v.lim END, "
        "(SELECT at FROM clock), (SELECT at FROM clock) FROM v ORDER BY v.name ON CONFLICT (name) DO NOTHING) "
        f"UPDATE {limiters} l SET {limit} = v.lim, per = v.per, "
        "tokens = CASE WHEN v.per IS NULL THEN NULL ELSE LEAST(COALESCE(l.tokens, v.lim), v.lim) END, "
        "refilled_at = COALESCE(l.refilled_at, (SELECT at FROM clock)) "
        f"FROM v WHERE l.name = v.name AND (l.{limit}, l.per) IS DISTINCT FROM (v.lim, v.per)"
    )


@builds("release_slots")
def release_slots(conn: Any) -> str:
    """Give back one slot per name of an array (repeats give back more), rows locked in name order (PostgreSQL).

    Outcomes of steps of the same keys lock the rows in the same order, so two never
    deadlock. A slot count never goes below zero (a row made again after a reset, say).
    """
    limiters, in_use = table(conn, WorkflowLimiter), column(conn, WorkflowLimiter, "in_use")
    kind = literal(CONCURRENCY)
    locked = f"SELECT name FROM {limiters} WHERE name = ANY(%s) AND kind = {kind} ORDER BY name FOR UPDATE"
    given = "SELECT count(*) FROM unnest(%s::text[]) AS x(name) WHERE x.name = l.name"
    return f"UPDATE {limiters} l SET {in_use} = GREATEST(l.{in_use} - ({given}), 0) WHERE l.name IN ({locked})"
