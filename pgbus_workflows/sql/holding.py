"""What the claims add for holds: the active holds' names, read once per claim statement.

Registered statements of ``services.holding`` live here too, built with the same helpers as
every other statement (``sql.statements``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from ..models import HoldKind, WorkflowHold
from .statements import literal, table


def held_names(conn: Any, kind: HoldKind) -> str:
    """An array of the names of the active holds of ``kind``: an uncorrelated subquery, evaluated once.

    Read through the partial unique index of active holds (``pgbus_wf_hold_active``): with
    nothing held, one descent of an empty index per claim.
    """
    active = f"SELECT name FROM {table(conn, WorkflowHold)} WHERE kind = {literal(kind)} AND released_at IS NULL"
    return f"ARRAY({active})"


def is_held(class_name: str, queue: str) -> bool:
    """Whether the class or the queue is held now (an outcome asks before it chains the next step).

    One descent of the active holds' index (``pgbus_wf_hold_active``): with nothing held, an
    empty index.
    """
    active = WorkflowHold.objects.filter(released_at__isnull=True)
    return active.filter(Q(kind=HoldKind.CLASS, name=class_name) | Q(kind=HoldKind.QUEUE, name=queue)).exists()
