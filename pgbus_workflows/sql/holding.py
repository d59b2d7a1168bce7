"""What the claims add for holds: the active holds' names, read once per claim statement.

Registered statements of ``services.holding`` live here too, built with the same helpers as
every other statement (``sql.statements``).
"""

from __future__ import annotations

from typing import Any

from ..models import HoldKind, WorkflowHold, WorkflowRun, WorkflowStep
from ..states import StepStatus
from .statements import builds, literal, table

#: What ``parked_on`` starts with for a step a hold parked (limiters are ``concurrency:`` and ``rate:``).
HOLD_PREFIX = "hold:"


def held_names(conn: Any, kind: HoldKind) -> str:
    """An array of the names of the active holds of ``kind``: an uncorrelated subquery, evaluated once.

    Read through the partial unique index of active holds (``pgbus_wf_hold_active``): with
    nothing held, one descent of an empty index per claim.
    """
    active = f"SELECT name FROM {table(conn, WorkflowHold)} WHERE kind = {literal(kind)} AND released_at IS NULL"
    return f"ARRAY({active})"


def held_pairs(conn: Any) -> str:
    """An array of ``kind:name`` for every hold in force, for a statement's row (:func:`holds_from` reads it)."""
    active = f"SELECT kind || ':' || name FROM {table(conn, WorkflowHold)} WHERE released_at IS NULL"
    return f"ARRAY({active})"


def holds_from(pairs: list[str]) -> frozenset[tuple[str, str]]:
    """``(kind, name)`` of each ``kind:name`` of :func:`held_pairs` (a kind has no colon; a name may)."""
    return frozenset((kind, name) for kind, _, name in (pair.partition(":") for pair in pairs))


def active_holds() -> frozenset[tuple[str, str]]:
    """``(kind, name)`` of every hold in force: one descent of the active holds' index (empty when none)."""
    return frozenset(WorkflowHold.objects.filter(released_at__isnull=True).values_list("kind", "name"))


def parked_on(kind: HoldKind, name: str) -> str:
    """The ``parked_on`` of the steps a hold parked: ``hold:class:<name>`` or ``hold:queue:<name>``."""
    return f"{HOLD_PREFIX}{kind.value}:{name}"


@builds("park_held")
def park_held(conn: Any) -> str:
    """Park scheduled attempts of held classes and on held queues, at most a batch (PostgreSQL).

    Parked, they leave the due range the claims read (as steps a full limit holds back do),
    so a held class's backlog costs the other classes' claims nothing. ``parked_on`` names the
    hold (:func:`parked_on`; a queue's hold first). Read through the partial index of
    scheduled attempts; ``SKIP LOCKED``: a step being claimed or moved is parked by a later
    pass. Placeholder: the batch's size.
    """
    steps, runs = table(conn, WorkflowStep), table(conn, WorkflowRun)
    classes, queues = held_names(conn, HoldKind.CLASS), held_names(conn, HoldKind.QUEUE)
    on = (
        f"CASE WHEN s.queue = ANY({queues}) THEN '{HOLD_PREFIX}queue:' || s.queue "
        f"ELSE '{HOLD_PREFIX}class:' || r.workflow_class END"
    )
    found = (
        f"SELECT s.id, {on} AS hold FROM {steps} s JOIN {runs} r ON r.id = s.run_id "
        f"WHERE s.status = {literal(StepStatus.SCHEDULED)} AND NOT s.parked "
        f"AND (s.queue = ANY({queues}) OR r.workflow_class = ANY({classes})) LIMIT %s FOR UPDATE OF s SKIP LOCKED"
    )
    return (
        f"WITH found AS ({found}) UPDATE {steps} s SET parked = true, parked_on = found.hold "
        "FROM found WHERE s.id = found.id"
    )


@builds("unpark_held")
def unpark_held(conn: Any) -> str:
    """Put back a batch of the attempts one hold parked, through the parked index (PostgreSQL).

    Placeholders: the hold's ``parked_on``, the batch's size.
    """
    steps = table(conn, WorkflowStep)
    batch = (
        f"SELECT id FROM {steps} WHERE status = {literal(StepStatus.SCHEDULED)} AND parked AND parked_on = %s "
        "LIMIT %s FOR UPDATE"
    )
    return f"UPDATE {steps} SET parked = false, parked_on = '' WHERE id IN ({batch})"
