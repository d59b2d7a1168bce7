"""The statements of ``Fairness``: a tagged step's place in the claims' order, and the claim's fair range.

A step of a class with ``Fairness`` scheduled due at once is tagged (:func:`tag_fair`): it
stores its key and ``fair_at``, its due time or one spacing (a quantum divided by the key's
weight) after the last tagged step of its key still waiting, whichever is later. A step
scheduled for later stores its key alone, and is placed at its due time by a claim once it
comes due (:func:`came_due`). No row per
key, no lock of its own: the key's last waiting step is one descent of the partial index
``pgbus_wf_step_fair_key``. A claim whose catalog has a class with fairness reads the tagged
claimable steps of a priority in that order (the partial index ``pgbus_wf_step_fair``) beside
its due range (:func:`fair_priority`): a claim costs one more index range, whatever the
number of keys or the backlog of one.

Registered in the same :data:`.statements.BUILDERS` as every other statement.
"""

from __future__ import annotations

from typing import Any

from ..models import WorkflowStep
from ..states import StepStatus
from .statements import builds, literal, table


@builds("tag_fair")
def tag_fair(conn: Any) -> str:
    """Tag the scheduled attempts of some runs with their fairness key and place (PostgreSQL).

    Placeholders: arrays of run keys, fairness keys and spacings (intervals), one item per run
    whose scheduled attempt was just written (one due later gets its key, no place yet). Several runs of one key in one
    statement take places one spacing apart, in run order. An attempt tagged already, or no
    longer scheduled (claimed since), is left as it is.
    """
    steps = table(conn, WorkflowStep)
    scheduled = literal(StepStatus.SCHEDULED)
    given = "SELECT * FROM unnest(%s::bigint[], %s::text[], %s::interval[]) AS v(run, key, spacing)"
    ranked = "SELECT v.*, row_number() OVER (PARTITION BY v.key ORDER BY v.run) AS n FROM v"
    last = (
        f"SELECT k.key, (SELECT max(p.fair_at) FROM {steps} p WHERE p.fair_key = k.key AND p.status = {scheduled} "
        "AND p.fair_at IS NOT NULL) AS at FROM (SELECT DISTINCT key FROM v) k"
    )
    place = "GREATEST(s.scheduled_at, COALESCE(l.at, s.scheduled_at - r.spacing) + r.n * r.spacing)"
    # A step due later keeps no place: a claim gives it one when it comes due (:func:`came_due`).
    place = f"CASE WHEN s.scheduled_at <= s.created_at THEN {place} END"
    return (
        f"WITH v AS ({given}), ranked AS ({ranked}), last AS ({last}) "
        f"UPDATE {steps} s SET fair_key = r.key, fair_at = {place} FROM ranked r JOIN last l ON l.key = r.key "
        f"WHERE s.run_id = r.run AND s.status = {scheduled} AND s.fair_at IS NULL"
    )


def came_due(conn: Any, at: str, exclude: str, limit: str) -> str:
    """CTE ``came_due``: the first steps of classes with fairness that came due after a wait, placed at their due time.

    Read through the partial index of keyed steps with no place (``pgbus_wf_step_fair_later``:
    a step scheduled for later, a wait, a backoff, a debounce), at most ``limit``, ``SKIP
    LOCKED``; ``exclude`` (a CTE with ``step_key``): the steps this statement claims, left as
    they are. Placed at its due time, a step that waited is taken in turn with the keys'
    first waiting steps by the next claim (this statement's snapshot does not see the place).
    """
    steps = table(conn, WorkflowStep)
    first = (
        f"SELECT y.id FROM {steps} y WHERE y.status = {literal(StepStatus.SCHEDULED)} AND y.fair_key > '' "
        f"AND y.fair_at IS NULL AND NOT y.held AND NOT y.parked AND y.scheduled_at <= {at} "
        f"AND y.id NOT IN (SELECT step_key FROM {exclude}) ORDER BY y.scheduled_at LIMIT {limit} "
        "FOR UPDATE OF y SKIP LOCKED"
    )
    return (
        f"came_due AS (UPDATE {steps} s SET fair_at = s.scheduled_at "
        f"WHERE s.id = ANY(ARRAY({first})) AND s.fair_at IS NULL RETURNING s.id)"
    )


def fair_priority(due_scan: str, fair_scan: str, limit: str) -> str:
    """One priority's candidates of a claim with fairness: its due range's untagged steps and its fair range, merged.

    ``due_scan``: the claim's due range (the first ``limit`` due steps by due time, locked);
    ``fair_scan``: the tagged claimable steps in fair order (the first ``limit``, locked). A
    tagged step the due range locked is taken from the fair range alone. The two are merged
    by place (``fair_at``, or the due time of an untagged step), the first ``limit`` kept:
    steps locked and left out are let go at the commit, untouched.
    """
    merged = f"SELECT * FROM ({due_scan}) d0 WHERE d0.fair_at IS NULL UNION ALL SELECT * FROM ({fair_scan}) f0"
    return f"SELECT u.* FROM ({merged}) u ORDER BY COALESCE(u.fair_at, u.scheduled_at), u.step_key LIMIT {limit}"
