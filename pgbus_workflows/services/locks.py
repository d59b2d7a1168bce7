"""The run lock: every state move of a run happens inside one of these blocks.

The run's row is locked (``SELECT ... FOR UPDATE``) before any of its steps, always in
that order, and what the block's :class:`~.ledger.RunLedger` collected (transitions,
events, wake-ups) is written in the same transaction when the block ends. Once that
transaction commits, the block resolves the fan-outs its ledgers asked for (a child run
ended, or a fan-out's children were all found ended): :func:`resolve_if_done`, each in a
block of its own, which may end a parent that is itself a child, and so on up.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import partial

from django.db import transaction

from .. import sql
from ..conf import settings
from ..models import FanOutJob, WorkflowRun, WorkflowStep
from ..sql import rows
from ..sql.bulk import WriteBatch
from .ledger import RunLedger, Unit
from .resolution import resolve_in_ledger, unfinished
from .transactions import with_reconnect


class RunLocked(Exception):
    """``skip_locked``: another transaction holds the run (a body, an operator): it is alive."""


@contextmanager
def locked_step(
    run_pk: int, step_pk: int, *, now: datetime | None = None, savepoint: bool = True, skip_locked: bool = False
) -> Iterator[tuple[RunLedger, WorkflowStep | None]]:
    """Lock run ``run_pk``, then its step ``step_pk`` (None when it is gone), for a unit of work.

    On PostgreSQL both locks take one round trip; the order is run, then step, as always.
    ``skip_locked`` (the sweep) raises :class:`RunLocked` instead of waiting for a run that
    another transaction holds. ``savepoint=False`` joins the caller's transaction as it is.
    """
    with transaction.atomic(savepoint=savepoint):
        pair = None
        if skip_locked:
            run = rows.lock(WorkflowRun, {"id": run_pk}, skip_locked=True)
            if run is None:
                if WorkflowRun.objects.filter(pk=run_pk).exists():
                    raise RunLocked(f"Run {run_pk} is locked by another transaction")
                raise WorkflowRun.DoesNotExist(f"No workflow run with pk {run_pk}")
            ledger = RunLedger(run, now)
            yield ledger, ledger.lock_step(step_pk)
            ledger.flush()
            _resolve_after_commit([ledger])
            return
        if sql.postgresql():
            pair = rows.lock_pair(WorkflowRun, WorkflowStep, "run_id", run_pk, step_pk)
        if pair is not None:
            ledger = RunLedger(pair[0], now)
            yield ledger, pair[1]
        else:
            run = rows.lock(WorkflowRun, {"id": run_pk})
            if run is None:
                raise WorkflowRun.DoesNotExist(f"No workflow run with pk {run_pk}")
            ledger = RunLedger(run, now)
            yield ledger, ledger.lock_step(step_pk)
        ledger.flush()
        _resolve_after_commit([ledger])


@contextmanager
def locked_steps(
    items: Sequence[tuple[int, int, str | None]], *, now: datetime | None = None, savepoint: bool = True
) -> Iterator[list[Unit]]:
    """Lock several runs and one step of each, for units of work written together.

    ``items`` are ``(run pk, step pk, name of the step that may be scheduled next)``, one
    per run. Runs are locked in key order, then their steps. Each item gets a unit, in the
    order of ``items``: its ledger and its step (the step is None when it is gone, the
    ledger too when the run is). The units' writes are sent together when the block ends:
    four round trips with the BEGIN and the COMMIT, for any number of units (``commit_once``
    asks for the transaction's id in the locks' round trip). ``savepoint=False`` joins the
    caller's transaction as it is (the caller rolls back everything on an error).
    """
    if not sql.postgresql():
        with transaction.atomic(savepoint=savepoint):
            units: list[Unit] = []
            for run_pk, step_pk, _ in sorted(items):
                run = rows.lock(WorkflowRun, {"id": run_pk})
                ledger = None if run is None else RunLedger(run, now)
                units.append((ledger, None if ledger is None else ledger.lock_step(step_pk)))
            by_step = {step_pk: unit for (_, step_pk, _), unit in zip(sorted(items), units, strict=True)}
            units = [by_step[step_pk] for _, step_pk, _ in items]
            yield units
            for ledger, _ in units:
                if ledger is not None:
                    ledger.flush()
            _resolve_after_commit(ledger for ledger, _ in units if ledger is not None)
        return
    names = sorted({name for _, _, name in items if name})
    attempts = (sql.statement("latest_attempts"), [[run_pk for run_pk, _, _ in items], names])
    with transaction.atomic(savepoint=savepoint):
        locked, counts = rows.lock_pairs(
            WorkflowRun, WorkflowStep, "run_id", [(r, s) for r, s, _ in items], then=attempts if names else None
        )
        latest = {(run_pk, name): n for run_pk, name, n in counts}
        writes = WriteBatch()
        units = []
        for run_pk, step_pk, name in items:
            pair = locked.get(step_pk)
            if pair is None:
                run = rows.lock(WorkflowRun, {"id": run_pk})  # the step is gone (or the run)
                units.append((None if run is None else RunLedger(run, now, writes=writes), None))
                continue
            next_attempts = {name: latest.get((run_pk, name), 0) + 1} if name else None
            units.append((RunLedger(pair[0], now, writes=writes, next_attempts=next_attempts), pair[1]))
        yield units
        for ledger, _ in units:
            if ledger is not None:
                ledger.flush()
        writes.send(settings.NOTIFY_CHANNEL)
        _resolve_after_commit(ledger for ledger, _ in units if ledger is not None)


@contextmanager
def locked_run(pk: int, *, now: datetime | None = None) -> Iterator[RunLedger]:
    """Lock run ``pk`` for a unit of work; everything is written when the block ends.

    Raises ``WorkflowRun.DoesNotExist`` when there is no such run.
    """
    with transaction.atomic():
        run = rows.lock(WorkflowRun, {"id": pk})
        if run is None:
            raise WorkflowRun.DoesNotExist(f"No workflow run with pk {pk}")
        ledger = RunLedger(run, now)
        yield ledger
        ledger.flush()
        _resolve_after_commit([ledger])


def resolve_if_done(step_pk: int, run_pk: int, *, skip_locked: bool = False) -> bool:
    """Resolve the fan-out when no job is left; True for the one caller whose resolution won.

    ``skip_locked`` (the sweep): raise :class:`RunLocked` rather than wait for the run.
    """
    if unfinished(step_pk):
        return False
    with locked_step(run_pk, step_pk, skip_locked=skip_locked) as (ledger, step):
        if step is None:
            return False
        return resolve_in_ledger(ledger, step)


def _resolve_after_commit(ledgers: Iterable[RunLedger]) -> None:
    """Once the current transaction commits, resolve each fan-out the ``ledgers`` asked for, once.

    Siblings ending in one batch ask for their parent's fan-out once; the fan-outs of the
    jobs a child's end wrote are looked up then, in one query for all of them.
    """
    fan_outs: set[tuple[int, int]] = set()
    job_pks: set[int] = set()
    for ledger in ledgers:
        fan_outs |= ledger.settling
        job_pks |= ledger.settling_jobs
    if not (fan_outs or job_pks):
        return

    def resolve() -> None:
        if job_pks:
            fan_outs.update(
                FanOutJob.objects.filter(pk__in=sorted(job_pks)).values_list("step_id", "run_id").distinct()
            )
        for step_pk, run_pk in sorted(fan_outs):
            with_reconnect(partial(resolve_if_done, step_pk, run_pk))

    transaction.on_commit(resolve, robust=True)
