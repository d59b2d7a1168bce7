"""Fairness: a step of a class with ``Fairness``, scheduled due at once, tagged with its place in the claims' order.

The key and its weight are evaluated when the step is scheduled (``dsl.fairness.fair_tag``);
the place is written in the caller's transaction, after the step's row (``sql`` ``tag_fair``):
with a batch of units (the dispatcher's outcomes), in the batch's one statement for every
unit's steps, so an outcome of a class with fairness costs no round trip of its own. A step
scheduled for later (a wait, a backoff, a debounce) gets its key only, and a claim places it
when it comes due; a step handed straight to the worker that ran the step before it is not
tagged (it is not claimed). Classes without fairness write nothing and read nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from .. import sql
from ..dsl.fairness import fair_tag, has_fairness
from ..models import WorkflowRun, WorkflowStep
from ..sql.bulk import WriteBatch

#: One run's scheduled attempt to tag: ``(run key, fairness key, spacing)``.
Tag = tuple[int, str, timedelta]


def place(cls: Any, step: WorkflowStep, run: WorkflowRun, now: datetime, handle: Callable[[], Any]) -> Tag | None:
    """What to tag ``step`` of ``run`` with (None: its class has no fairness, or no PostgreSQL)."""
    if not has_fairness(cls) or not sql.postgresql():
        return None
    found = fair_tag(cls, step.step_name, handle)
    return None if found is None else (run.pk, *found)


def tag_statement(items: list[Tag]) -> sql.Statement:
    """The write that tags the scheduled attempts of these runs (``sql`` ``tag_fair``)."""
    ordered = sorted(items)
    return sql.statement("tag_fair"), [[i[0] for i in ordered], [i[1] for i in ordered], [i[2] for i in ordered]]


def write(items: list[Tag], writes: WriteBatch | None = None) -> None:
    """Tag the runs' attempts, written already in this transaction (with ``writes``: among the batch's last writes)."""
    if not items:
        return
    if writes is not None:
        writes.merge("tag_fair", tag_statement, items)
    else:
        sql.run_batch([tag_statement(items)])


def tag(ledger: Any, step: WorkflowStep) -> None:
    """Tag ``step``, which ``ledger`` (a ``RunLedger``) just scheduled, if its class has fairness."""
    found = place(ledger.cls, step, ledger.run, ledger.now, lambda: ledger.cls(ledger.run))
    if found is not None:
        write([found], ledger.writes)
