"""The read tools: health, runs, one run's page, stuck runs, a class's insights, schedules, limits. They write nothing.

Each body takes the :class:`~pgbus_workflows.operating.operators.Operator` first (the server
passes it), then the tool's arguments; its docstring is the tool's description. They read
what ``manage.py workflows list|show`` and ``schedules list`` read (``operating.runs``,
``operating.schedules``), through the same indexes, and see what the operator may see: with
``--as-user``, the runs and rows the admin would show that user. A workflow class no code
registers and no row names is a tool error in each of them, never an empty list.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from ..dsl.declared import registry
from ..dsl.limits import CONCURRENCY, RATE, Concurrency, declared_limits
from ..models import WorkflowEvent, WorkflowRun, WorkflowSchedule
from ..operating.limits import limits_report
from ..operating.operators import Operator, show_page
from ..operating.runs import (
    RunNotFound,
    Subject,
    find_run,
    run_row,
    with_latest_attempt,
)
from ..operating.runs import list_runs as matching_runs
from ..operating.schedules import ScheduleCommands, schedule_row
from ..services.health import check_health
from ..services.insights import DEFAULT_WINDOW, WINDOWS, class_insights
from ..services.stuck import STUCK_REASONS
from .acting import viewing
from .arguments import (
    Classes,
    ClassName,
    Limit,
    LimiterKind,
    LimitsOrder,
    Page,
    RunId,
    Statuses,
    StuckReason,
    SubjectText,
    WindowName,
    rows_of_page,
)

#: The event kinds that pause a run: the latest one says what its ``paused_reason`` is built from.
PAUSING = ("paused", "step_failed", "step_stalled")


def known(classes: list[str] | None) -> list[str]:
    """``classes``, each registered by the code or named by a stored run or schedule; else a tool error naming it."""
    unknown = [
        name
        for name in classes or []
        if not registry.is_registered(name)
        # One index probe each (at most MAX_CLASSES): a retired class may have millions of runs.
        and not WorkflowRun.objects.filter(workflow_class=name).exists()
        and not WorkflowSchedule.objects.filter(workflow_class=name).exists()
    ]
    if unknown:
        names = ", ".join(repr(name) for name in sorted(set(unknown)))
        raise ToolError(
            f"No workflow class {names}: none is registered under that name, no run or schedule of it is stored"
        )
    return classes or []


def runs_page(
    operator: Operator,
    *,
    classes: list[str],
    statuses: list[str],
    stuck: str | None,
    subject: Subject | None,
    limit: int,
    page: int,
) -> dict[str, Any]:
    """One page of the newest runs the operator may see that match every filter, and whether more match."""
    runs, more = matching_runs(
        operator.runs(), classes=known(classes), statuses=statuses, stuck=stuck, subject=subject, limit=limit * page
    )
    return {"runs": [run_row(run) for run in rows_of_page(runs, limit, page)], "page": page, "more": more}


def list_runs(
    operator: Operator,
    workflow_class: Classes | None = None,
    status: Statuses | None = None,
    stuck: StuckReason | None = None,
    subject: SubjectText | None = None,
    limit: Limit = 20,
    page: Page = 1,
) -> dict[str, Any]:
    """List workflow runs, newest first, matching every filter given: class, status, stuck reason, subject.

    Each run: its workflow_id, class, status, current step, latest attempt number, subject and
    times. "more" says whether further pages hold more runs. Use show_run for one run's detail.
    """
    viewing(operator)
    try:
        parsed = Subject.parse(subject) if subject is not None else None
    except ValueError as error:
        raise ToolError(f"subject: {error}") from None
    return runs_page(
        operator,
        classes=workflow_class or [],
        statuses=status or [],
        stuck=stuck,
        subject=parsed,
        limit=limit,
        page=page,
    )


def show_run(
    operator: Operator,
    workflow_id: RunId,
    attempts: Annotated[Limit, Field(description="How many of the latest step attempts to show.")] = 20,
    events: Annotated[Limit, Field(description="How many of the latest audit events to show.")] = 20,
    signals: Annotated[Limit, Field(description="How many pending signals to show, oldest first.")] = 20,
) -> dict[str, Any]:
    """Show one workflow run: its fields, the verbs it allows now, what holds it back, its latest step
    attempts (with errors), its latest audit events (who did what, why) and its pending signals.

    A list is null when the operator may not view its rows; "older_..._omitted" says a list was cut.
    """
    viewing(operator)
    try:
        run = find_run(with_latest_attempt(operator.runs()), workflow_id)
    except RunNotFound as error:
        raise ToolError(str(error)) from None
    page = show_page(operator, run, attempts, events, signals)
    page["run"]["paused_by"] = paused_by(run)
    page["run"]["debounce_key_from"] = debounce_key_from(run)
    if page["held_back"] is not None:
        fixed = fixed_keys(run.workflow_class, page["held_back"]["step"])
        for hold in page["held_back"]["limits"]:
            hold["fixed_key"] = (hold["kind"], hold["key"]) in fixed
    return page


def paused_by(run: WorkflowRun) -> str | None:
    """The kind of the event that paused ``run`` (``paused``, ``step_failed``, ``step_stalled``); None unless paused."""
    if not run.paused_reason:
        return None
    latest = WorkflowEvent.objects.filter(run_id=run.pk, to_status="paused", kind__in=PAUSING).order_by("-pk").first()
    return latest.kind if latest is not None else None


def debounce_key_from(run: WorkflowRun) -> str | None:
    """What the run's debounce key is built from: ``code`` (a string), ``subject``, ``arguments`` (a callable)."""
    cls = registry.get(run.workflow_class)
    if run.debounce_key is None or cls is None or cls.debounce is None:
        return None
    key = cls.debounce.key
    return "arguments" if callable(key) else "subject" if key is None else "code"


def fixed_keys(workflow_class: str, step_name: str) -> set[tuple[str, str]]:
    """``(kind, key)`` of the step's limits whose key the code fixes, not a callable of the run."""
    cls = registry.get(workflow_class)
    definition = cls.step_definition(step_name) if cls is not None else None
    if definition is None:
        return set()
    return {
        (CONCURRENCY if isinstance(limit, Concurrency) else RATE, limit.key)
        for limit in declared_limits(cls, definition)
        if isinstance(limit.key, str)
    }


def health(operator: Operator) -> dict[str, Any]:
    """Is everything OK: one verdict (healthy or not) and its reasons, notes worth a look, each
    dispatcher's last heartbeat, how long the oldest due step has waited, the runs stuck by
    reason, the steps held back by limits and the schedules whose last tick failed.
    """
    viewing(operator)
    return check_health().as_dict()


def stuck_runs(
    operator: Operator,
    reason: StuckReason | None = None,
    workflow_class: Classes | None = None,
    limit: Limit = 20,
    page: Page = 1,
) -> dict[str, Any]:
    """List the runs that look stuck, newest first, for one reason or for each: stalled, overdue,
    waiting_overdue, paused_on_error, fan_out_unresolved (the reasons the admin's dashboard counts).

    The page and limit apply to each reason's list.
    """
    viewing(operator)
    known(workflow_class)
    reasons = [reason] if reason is not None else list(STUCK_REASONS)
    found = [
        {
            # Not "reason": redaction hides every field of that name (an event's may quote an error).
            "stuck_reason": name,
            **runs_page(
                operator,
                classes=workflow_class or [],
                statuses=[],
                stuck=name,
                subject=None,
                limit=limit,
                page=page,
            ),
        }
        for name in reasons
    ]
    return {"stuck": found, "page": page}


def insights(operator: Operator, workflow_class: ClassName, window: WindowName = DEFAULT_WINDOW) -> dict[str, Any]:
    """Insights on one workflow class over a window: its pipeline (ongoing runs at each step, by
    status), each step's performance (attempts that finished: outcomes, reattempts, p50/p95
    seconds) and its funnel (of the runs the window started, how many reached each step).
    """
    viewing(operator)
    known([workflow_class])
    try:
        return class_insights(workflow_class, WINDOWS[window])
    except LookupError as error:
        raise ToolError(str(error)) from None


def list_schedules(
    operator: Operator,
    workflow_class: Classes | None = None,
    limit: Limit = 50,
    page: Page = 1,
) -> dict[str, Any]:
    """List the workflow schedules by class and name: each one's id, state (active, paused,
    disabled, class not registered), expression, next and last fire time.
    """
    schedules = ScheduleCommands(operator).schedules().order_by("workflow_class", "name", "pk")
    classes = known(workflow_class)
    if classes:
        schedules = schedules.filter(workflow_class__in=classes)
    rows = list(schedules[: limit * page + 1])
    shown = rows_of_page(rows, limit, page)
    return {"schedules": [schedule_row(s) for s in shown], "page": page, "more": len(rows) > limit * page}


def limits(
    operator: Operator,
    kind: LimiterKind | None = None,
    order: LimitsOrder = "held_back",
    limit: Limit = 20,
) -> dict[str, Any]:
    """List the concurrency keys and rate limits in use or holding steps back, busiest first: each
    key's limit, its slots in use (a concurrency key) or its whole tokens now and the seconds until
    the next (a rate limit), and how many scheduled steps it holds back. Idle keys are left out.

    "busy" counts every such key, "more" says whether some were left out past "limit"; a key
    computed from a run's arguments is redacted like the arguments.
    """
    viewing(operator)
    return limits_report(operator, kind, order, limit)
