"""``ctx.map`` and ``ctx.child``: checkpoints that park the run on fan-out jobs or on a child run.

Both open the engine's own fan-out on the checkpoint's row (the same job rows, job runner,
child lineage and recovery as a ``@fan_out`` step), and the run parks: no thread, slot or lock
is held. When the last member ends, a durable class's fan-out is not resolved by the process
that ended it (which may never have run the function, so knows none of its options): the row
is woken (``on_job_failure="run"`` in ``DurableWorkflow``), and the function runs again on it,
replays to the checkpoint and reads the members' ends here, in its own process. It then
records the results as the checkpoint's output (a replay returns them without a query of its
own), or applies the failure as a failed checkpoint: the checkpoint's policy, or
``StepFailed`` with ``on_exception="raise"``.

The functions here return ``(True, value)`` for the value the call gives the function, or
``(False, None)`` when the function must stop (the run parked); ``ctx`` raises then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..dsl.definitions import JOB_FAILURE_ACTIONS, OnException, StepDefinition
from ..dsl.jobs import PARENT_CLOSE_POLICIES, backoff_payload, job_path
from ..exceptions import ConfigurationError, FanOutFailed, StepFailed
from ..models import FanOutJob, JobStatus, WorkflowStep
from ..services.children import ChildStart, check_depth, child_key
from ..services.locks import locked_step
from ..services.outcome import StepOutcome, apply_outcome
from ..services.payload import encode_payload
from ..services.start import check_start
from ..states import StepOutcomeKind, StepStatus

#: What ``ctx.map`` takes beside the name, the function and the items.
MAP_OPTIONS = ("max_attempts", "backoff", "on_job_failure", "on_exception")
#: The keywords ``ctx.child`` keeps for itself; every other keyword is the child's argument.
CHILD_OPTIONS = ("parent_close", "on_exception")

#: What a member's row holds once it ended: ``(status, result, error)``.
Member = tuple[str, Any, str]


def map_items(ctx: Any, name: str, fn: Callable[..., Any], items: Iterable[Any], options: dict[str, Any]) -> Any:
    """``ctx.map``: one fan-out job per item calling ``fn(item)``; the results in item order once all ended."""
    path = _job_path(name, fn)
    definition = _definition(name, options, MAP_OPTIONS, "ctx.map")
    backoff = backoff_payload(options.get("backoff"), "ctx.map(backoff=)")
    checkpoint = ctx._number(name)
    landed = _replayed(ctx, checkpoint)
    if landed is not None:
        return landed
    type(ctx._workflow).remember(definition)
    step = ctx._take(checkpoint)
    members = _ended_members(step)
    if members is None:
        values = list(items)
        if not values:
            ctx._record(step, [])
            return True, []
        stored = {} if backoff is None else {"backoff": backoff}  # read by whichever process ends an attempt
        jobs = [
            (path, encode_payload({"args": [value], "kwargs": {}, **stored}, f"item {index} of ctx.map({name!r})"))
            for index, value in enumerate(values)
        ]
        _open(step, StepOutcome("fan_out", jobs=jobs))
        return False, None
    return _land(ctx, step, checkpoint, definition, members, "jobs", lambda results: results)


def start_child(ctx: Any, name: str, cls: Any, subject: Any, keywords: dict[str, Any]) -> Any:
    """``ctx.child``: start ``cls`` once as a child run, park until it ends; its result."""
    if not isinstance(cls, type) or not hasattr(cls, "step_definitions"):
        raise ConfigurationError(f"ctx.child({name!r}) takes a Workflow subclass, got {cls!r}")
    options = {key: keywords.pop(key) for key in CHILD_OPTIONS if key in keywords}
    parent_close = options.pop("parent_close", "cancel")
    if parent_close not in PARENT_CLOSE_POLICIES:
        choices = ", ".join(PARENT_CLOSE_POLICIES)
        raise ConfigurationError(f"ctx.child(parent_close=) must be one of {choices}, got {parent_close!r}")
    definition = _definition(name, options, CHILD_OPTIONS, "ctx.child")
    checkpoint = ctx._number(name)
    landed = _replayed(ctx, checkpoint)
    if landed is not None:
        return landed
    type(ctx._workflow).remember(definition)
    step = ctx._take(checkpoint)
    members = _ended_members(step)
    if members is None:
        run = ctx._workflow.record
        check_depth(run)
        checked = check_start(cls, subject, child_key(run, checkpoint, 0), keywords)
        _open(step, StepOutcome("fan_out", children=[ChildStart(cls, checked, parent_close)]))
        return False, None
    return _land(ctx, step, checkpoint, definition, members, "children", lambda results: results[0])


def _replayed(ctx: Any, checkpoint: str) -> tuple[bool, Any] | None:
    """``(True, output)`` of a recorded checkpoint (its recorded failure raised), None when it is not."""
    position = ctx._position
    if not ctx._replayed(checkpoint):
        return None
    done = ctx._replay[position]
    if done.failure is not None:
        raise StepFailed(done.name, *done.failure)
    return True, done.output


def _land(
    ctx: Any,
    step: WorkflowStep,
    checkpoint: str,
    definition: StepDefinition,
    members: list[Member],
    noun: str,
    shape: Callable[[list[Any]], Any],
) -> Any:
    """Every member ended: record the results (a failed member's is None), or fail the checkpoint."""
    failed = sum(1 for status, _, _ in members if status != JobStatus.SUCCEEDED)
    if failed and definition.on_job_failure == "fail":
        first = next(error for status, _, error in members if status != JobStatus.SUCCEEDED)
        last_line = first.strip().splitlines()[-1] if first.strip() else ""
        first_error = f" (first: {last_line})" if last_line else ""
        error = FanOutFailed(f"{failed} of {len(members)} {noun} of {checkpoint} failed{first_error}")
        return True, ctx._failed(step, checkpoint, definition, error)
    output = shape([result if status == JobStatus.SUCCEEDED else None for status, result, _ in members])
    ctx._record(step, output)
    return True, output


def _ended_members(step: WorkflowStep) -> list[Member] | None:
    """The ends of the members of the fan-out this attempt opened, in order; None when it opened none.

    A woken row carries its fan-out. A row that replaced it after a stall (its dispatcher died
    as the function read the ends) reads the stalled attempt's members, which all ended: the
    jobs are not run, nor the child started, again.
    """
    source = step.pk if step.fan_out_total is not None else _stalled_fan_out(step)
    if source is None:
        return None
    ends = FanOutJob.objects.filter(step_id=source).order_by("index").values_list("status", "result", "error")
    return [(status, result, error) for status, result, error in ends]


def _stalled_fan_out(step: WorkflowStep) -> int | None:
    """The fan-out row of this checkpoint that the attempts right before ``step`` stalled on, if any."""
    earlier = (
        WorkflowStep.objects.filter(run_id=step.run_id, step_name=step.step_name, pk__lt=step.pk)
        .order_by("-pk")
        .values_list("pk", "outcome", "fan_out_total")
    )
    for pk, outcome, total in earlier.iterator():
        if outcome != StepOutcomeKind.STALLED:
            return None
        if total is not None:
            return int(pk)
    return None


def _open(step: WorkflowStep, outcome: StepOutcome) -> None:
    """Park the in-progress checkpoint ``step`` on its jobs or child (one transaction, under the run's lock)."""
    with locked_step(step.run_id, step.pk) as (ledger, locked):
        if locked is not None and locked.status == StepStatus.IN_PROGRESS:
            apply_outcome(ledger, locked, outcome)


def _job_path(name: str, fn: Any) -> str:
    """The dotted path ``fn`` is stored by (as a fan-out job's); a clear error for a lambda or a closure."""
    try:
        return job_path(fn)
    except ConfigurationError as error:
        raise ConfigurationError(
            f"ctx.map({name!r}) stores each item as a fan-out job that names its function by dotted path: "
            f"pass a module-level function of an installed app, not {fn!r} ({error})"
        ) from None


def _definition(name: str, options: dict[str, Any], allowed: tuple[str, ...], call: str) -> StepDefinition:
    """The checkpoint's options as a definition (``on_exception="raise"``: the policy of action ``raise``)."""
    unknown = set(options) - set(allowed)
    if unknown:
        raise ConfigurationError(f"{call} takes {', '.join(allowed)}, not {', '.join(sorted(unknown))}")
    max_attempts = options.get("max_attempts", 1)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ConfigurationError(f"{call}(max_attempts=) must be a positive integer, got {max_attempts!r}")
    on_job_failure = options.get("on_job_failure", "fail")
    if on_job_failure not in JOB_FAILURE_ACTIONS:
        raise ConfigurationError(f"{call}(on_job_failure=) must be 'fail' or 'continue', got {on_job_failure!r}")
    policy = options.get("on_exception")
    fields: dict[str, Any] = {"max_attempts": max_attempts, "on_job_failure": on_job_failure}
    if policy == "raise":
        return StepDefinition(name=name, func=None, on_exception=OnException(action="raise"), **fields)
    if policy is None or isinstance(policy, OnException):
        return StepDefinition(name=name, func=None, on_exception=policy, **fields)
    raise ConfigurationError(f'{call}(on_exception=) takes an OnException or "raise", got {policy!r}')
