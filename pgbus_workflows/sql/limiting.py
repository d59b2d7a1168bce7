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
from ..models import WorkflowLimiter
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
    """The test that each of a step's limiter rows has room (true for a step with no limiters).

    Rows the lateral left out (no room, or locked by another claim) are those that exist
    with no room to give it: a name whose row is gone (deleted by an operator) limits
    nothing, so a step under it is never stranded. Counted only when the lateral left one
    out (``OR`` stops at the first true).
    """
    names = "ARRAY(SELECT jsonb_array_elements_text(s.limiters))"
    existing = f"(SELECT count(*) FROM {table(conn, WorkflowLimiter)} e WHERE e.name = ANY({names}))"
    whole = f"{lateral}.n = jsonb_array_length(s.limiters)"
    return f"(s.limiters IS NULL OR {whole} OR {lateral}.n = {existing})"


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
