"""Concurrency keys and rate limits: the limiter rows a step is scheduled under, taken and given back.

A step of a class or step with ``Concurrency`` or ``RateLimit`` (``dsl.limits``) stores the
names of its limiter rows when it is scheduled (:func:`bind`, which makes the rows). On
PostgreSQL the dispatcher's claim takes the slots and tokens in its own statement
(``sql.limiting``); a claim through the ledger (SQLite, ``run_now``, the test helpers) takes
them with :func:`take`. A step that leaves ``in_progress`` (its outcome, a stall found by the
sweep, a cancel) gives its slots back in the same transaction (:func:`release`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Count, F

from .. import sql
from ..dsl.declared import registry
from ..dsl.limits import CONCURRENCY, RATE, BoundLimit, Concurrency, declared_limits, limit_label, step_limits
from ..models import WorkflowLimiter, WorkflowRun, WorkflowStep
from ..sql import rows
from ..sql.bulk import WriteBatch
from ..states import StepStatus

if TYPE_CHECKING:
    from ..dsl.definitions import StepDefinition
    from .handle import RunHandle


def bind(
    cls: type[RunHandle],
    definition: StepDefinition,
    run: WorkflowRun,
    now: datetime,
    writes: WriteBatch | None = None,
    held: Sequence[str] = (),
) -> list[str] | None:
    """The limiter names of an attempt of ``definition`` about to be scheduled (None: it has no limits).

    The key callables see the run's handle; the rows are made (or their changed limit
    written) in the caller's transaction: with ``writes``, among its last writes (no round
    trip of its own; no claim sees the attempt before the commit). Rows in ``held`` (the run's
    previous attempt holds them) exist: a run's next step under its key writes nothing, and a
    changed limit is written by the next run's first step. ``ValueError`` naming the class and
    step for a bad key: raised before anything is written.
    """
    if not declared_limits(cls, definition):
        return None
    bound = step_limits(cls, definition, lambda: cls(run))
    ensure([limit for limit in bound if limit.name not in held], now, writes)
    return [limit.name for limit in bound]


def bind_copy(
    cls: type[RunHandle], definition: StepDefinition, run: WorkflowRun, first: WorkflowStep
) -> list[str] | None:
    """The limiters of ``run``'s copy of another run's attempt ``first`` (``start_many``).

    The same names, unless a key is a callable: evaluated for each run then.
    """
    if not any(callable(limit.key) for limit in declared_limits(cls, definition)):
        return first.limiters
    return bind(cls, definition, run, first.created_at)


def ensure(bound: Sequence[BoundLimit], now: datetime, writes: WriteBatch | None = None) -> None:
    """Make the limiter rows of ``bound`` that do not exist; write a limit or period that changed.

    With ``writes``, in the batch's one statement of every unit's limiters (:func:`ensure_statement`).
    """
    if not bound:
        return
    if sql.postgresql():
        if writes is not None:
            writes.merge("ensure_limiters", ensure_statement, [(limit, now) for limit in bound])
        else:
            sql.run_batch([ensure_statement([(limit, now) for limit in bound])])
        return
    for limit in bound:
        tokens = None if limit.per is None else float(limit.limit)
        row, made = WorkflowLimiter.objects.get_or_create(
            name=limit.name,
            defaults={"kind": limit.kind, "limit": limit.limit, "per": limit.per, "tokens": tokens, "refilled_at": now},
        )
        if not made and (row.limit, row.per) != (limit.limit, limit.per):
            WorkflowLimiter.objects.filter(name=limit.name).update(limit=limit.limit, per=limit.per)


def ensure_statement(items: list[tuple[BoundLimit, datetime]]) -> sql.Statement:
    """The write that makes the rows of these ``(limit, when)`` and writes changed limits, in name order."""
    first = {limit.name: (limit, at) for limit, at in reversed(items)}
    ordered = [first[name][0] for name in sorted(first)]
    params = [
        [limit.name for limit in ordered],
        [limit.kind for limit in ordered],
        [limit.limit for limit in ordered],
        [limit.per for limit in ordered],
        min(at for _limit, at in items),
    ]
    return sql.statement("ensure_limiters"), params


def room(limiter: WorkflowLimiter, now: datetime) -> int:
    """How many more steps ``limiter`` lets start at ``now``: free slots, or whole tokens."""
    if limiter.per is None:
        return limiter.limit - limiter.in_use
    return int(_tokens(limiter, now))


def _tokens(limiter: WorkflowLimiter, now: datetime) -> float:
    if limiter.per is None or limiter.refilled_at is None:
        return 0.0  # not a rate limiter
    elapsed = max((now - limiter.refilled_at).total_seconds(), 0.0)
    refill = elapsed * limiter.limit / limiter.per.total_seconds()
    return float(min(limiter.limit, (limiter.tokens or 0.0) + refill))


def full(now: datetime) -> set[str]:
    """The names of the limiters with no room at ``now`` (the claim through the ORM passes their steps over)."""
    limiters = WorkflowLimiter.objects.filter(in_use__gte=F("limit")) | WorkflowLimiter.objects.filter(
        per__isnull=False, tokens__lt=F("limit")
    )
    return {limiter.name for limiter in limiters if room(limiter, now) < 1}


def take(step: WorkflowStep, now: datetime) -> bool:
    """Take the slots and spend the tokens of a step being claimed through the ledger; False when one has no room.

    The limiter rows are locked in name order (the claims and outcomes of other steps lock
    them so too); with no room, nothing is written. A name whose row is gone limits nothing,
    as in the claim's statement (``sql.limiting.may_claim``).
    """
    if not step.limiters:
        return True
    names = sorted(set(step.limiters))
    limiters = list(WorkflowLimiter.objects.select_for_update().filter(name__in=names).order_by("name"))
    if any(room(limiter, now) < 1 for limiter in limiters):
        return False
    for limiter in limiters:
        if limiter.per is None:
            limiter.in_use += 1
            rows.update(limiter, ["in_use"])
            continue
        left = _tokens(limiter, now) - 1
        limiter.tokens = left
        limiter.refilled_at = at = max(limiter.refilled_at or now, now)  # a bucket's clock never goes back
        limiter.available_at = None if left >= 1 else at + limiter.per * ((1 - left) / limiter.limit)
        rows.update(limiter, ["tokens", "refilled_at", "available_at"])
    return True


def holds_no_slot(step: WorkflowStep) -> None:
    """Mark an attempt that a wait's end moves to ``in_progress`` without a claim: it gives back no slot."""
    step._pgbus_holds_no_slot = True  # type: ignore[attr-defined]


def hand_over(releasing: list[str], step: WorkflowStep) -> bool:
    """Whether ``step``, about to be chained onto the worker, may take over the slots its run gives back.

    A run's next step due at once keeps the slots of the attempt before it, on the same
    worker, when it is under concurrency keys alone, all of them given back in this unit of
    work (``releasing``, whose names it then takes out: never given back, never taken
    again). A step under a rate limit spends a token in a claim. A step without limits may
    always be chained.
    """
    if not step.limiters:
        return True
    names = sorted(set(step.limiters))
    if any(limit_label(name)[0] != CONCURRENCY or name not in releasing for name in names):
        return False
    for name in names:
        releasing.remove(name)
    return True


def releases(step: WorkflowStep, source: str, target: str) -> list[str]:
    """The concurrency limiters an attempt gives back as it moves from ``source`` to ``target``.

    Only a claimed attempt holds slots: one that a wait's end (a fan-out's last job, a
    timeout) moves through ``in_progress`` to its outcome took none (:func:`holds_no_slot`).
    """
    if not step.limiters or source != StepStatus.IN_PROGRESS or target == StepStatus.IN_PROGRESS:
        return []
    if getattr(step, "_pgbus_holds_no_slot", False):
        return []
    return [name for name in step.limiters if limit_label(name)[0] == CONCURRENCY]


def release_statement(names: Sequence[str]) -> sql.Statement:
    """The write that gives back one slot per name (PostgreSQL)."""
    return sql.statement("release_slots"), [sorted(names), sorted(set(names))]


def release(names: Iterable[str], writes: WriteBatch | None = None) -> bool:
    """Give back one slot per name, in the caller's transaction (with ``writes``, as its last writes).

    Returns whether there was any to give back (the caller then wakes the dispatchers).
    """
    given = list(names)
    if not given:
        return False
    if sql.postgresql():
        if writes is not None:  # with the batch's other units': one statement, rows locked in name order
            writes.merge("release_slots", release_statement, given)
        else:
            sql.run_batch([release_statement(given)])
        return True
    for name, count in sorted(Counter(given).items()):
        WorkflowLimiter.objects.filter(name=name, kind=CONCURRENCY, in_use__gte=count).update(
            in_use=F("in_use") - count
        )
    return True


def held_back(step: WorkflowStep, now: datetime) -> list[dict[str, Any]]:
    """What holds a due scheduled attempt back: each of its limiters with no room (empty: nothing does).

    Each as ``{"kind", "key", "limit", "in_use"}`` (a concurrency key) or ``{"kind", "key",
    "limit", "per", "next_token_at"}`` (a rate limit).
    """
    if not step.limiters or step.status != StepStatus.SCHEDULED or step.scheduled_at > now:
        return []
    found = []
    for limiter in WorkflowLimiter.objects.filter(name__in=step.limiters).order_by("name"):
        if room(limiter, now) >= 1:
            continue
        kind, key = limit_label(limiter.name)
        if limiter.per is None:
            found.append({"kind": kind, "key": key, "limit": limiter.limit, "in_use": limiter.in_use})
        else:
            wait = limiter.per * ((1 - _tokens(limiter, now)) / limiter.limit)
            next_at = now + max(wait, timedelta(0))
            found.append(
                {"kind": kind, "key": key, "limit": limiter.limit, "per": limiter.per, "next_token_at": next_at}
            )
    return found


def undeclared(step: WorkflowStep | None, workflow_class: str) -> list[str]:
    """The limiters an active attempt is under that its class's code declares no more (a deploy removed them).

    The claim takes such an attempt within those rows' limits all the same (the rows decide);
    the run page, ``workflows show`` and ``check --database default`` (W014) say so.
    """
    if step is None or not step.limiters or step.status not in (StepStatus.SCHEDULED, StepStatus.IN_PROGRESS):
        return []
    return undeclared_names(step.limiters, workflow_class, step.step_name)


def undeclared_names(names: Iterable[str], workflow_class: str, step_name: str) -> list[str]:
    """Those of ``names`` this code's step does not declare: no fixed key of that name, no callable key of its kind."""
    cls = registry.get(workflow_class)
    definition = cls.step_definition(step_name) if cls is not None else None
    declared = set()
    for limit in declared_limits(cls, definition) if definition is not None else ():
        kind = CONCURRENCY if isinstance(limit, Concurrency) else RATE
        declared.add(kind if callable(limit.key) else f"{kind}:{limit.key}")  # a kind has no ":", a name has
    return [name for name in names if name not in declared and limit_label(name)[0] not in declared]


def describe(holds: list[dict[str, Any]]) -> str:
    """One line for an operator: ``concurrency account:42 (1 of 1 in use); rate stripe (100 per 0:00:01)``."""
    parts = []
    for hold in holds:
        if hold["kind"] == CONCURRENCY:
            parts.append(f"concurrency key {hold['key']!r} ({hold['in_use']} of {hold['limit']} in use)")
        else:
            every = f"{hold['limit']} per {hold['per']}"
            parts.append(f"rate limit {hold['key']!r} ({every}, next token at {hold['next_token_at']:%H:%M:%S})")
    return "; ".join(parts)


def held_back_counts(now: datetime) -> dict[tuple[str, str], int]:
    """``{(class, step): attempts}`` due now and held back by a limit with no room (the gauge, the dashboard).

    The parked ones (a claim found them held back) are counted from the parked index
    (``pgbus_wf_step_parked``, which holds their step names and runs) and their runs'
    classes; the others are read through the partial index of unparked scheduled attempts
    under limits (``pgbus_wf_step_limited``): the cost grows with the steps under limits
    only, never with the rest of the queue.
    """
    due = WorkflowStep.objects.filter(
        status=StepStatus.SCHEDULED,
        held=False,
        parked=False,
        scheduled_at__lte=now,
        limiters__isnull=False,
        run__status="ready",
    ).values_list("run__workflow_class", "step_name", "limiters")
    found = list(due)
    names = {name for _klass, _step, limiters in found for name in limiters or ()}
    full = {limiter.name for limiter in WorkflowLimiter.objects.filter(name__in=names) if room(limiter, now) < 1}
    counts: Counter[tuple[str, str]] = Counter()
    for klass, step_name, limiters in found:
        if full.intersection(limiters or ()):
            counts[(klass, step_name)] += 1
    # parked_on > '' (every parked step's): the parked index's range, read alone but for the runs' classes.
    parked = WorkflowStep.objects.filter(status=StepStatus.SCHEDULED, parked=True, parked_on__gt="").order_by()
    parked = parked.exclude(parked_on__startswith="hold:")  # an operator's hold, not a limit (services.holding)
    for klass, step_name, n in parked.values_list("run__workflow_class", "step_name").annotate(n=Count("pk")):
        counts[(klass, step_name)] += n
    return dict(counts)
