"""The read tools: runs, one run's page, stuck runs, a class's insights, schedules. They write nothing.

Each body takes the :class:`~pgbus_workflows.management.operating.Operator` first (the server
passes it), then the tool's arguments; its docstring is the tool's description. They read
what ``manage.py workflows list|show`` and ``schedules list`` read (``management.runs``,
``management.schedules``), through the same indexes, and see what the operator may see: with
``--as-user``, the runs and rows the admin would show that user.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from ..management.operating import Operator, show_page
from ..management.runs import (
    RunNotFound,
    Subject,
    find_run,
    run_row,
    with_latest_attempt,
)
from ..management.runs import list_runs as matching_runs
from ..management.schedules import ScheduleCommands, schedule_row
from ..services.insights import DEFAULT_WINDOW, WINDOWS, class_insights
from ..services.stuck import STUCK_REASONS
from .acting import viewing
from .arguments import (
    Classes,
    ClassName,
    Limit,
    Page,
    RunId,
    Statuses,
    StuckReason,
    SubjectText,
    WindowName,
    rows_of_page,
)


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
        operator.runs(), classes=classes, statuses=statuses, stuck=stuck, subject=subject, limit=limit * page
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
    return show_page(operator, run, attempts, events, signals)


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
    if workflow_class:
        schedules = schedules.filter(workflow_class__in=workflow_class)
    rows = list(schedules[: limit * page + 1])
    shown = rows_of_page(rows, limit, page)
    return {"schedules": [schedule_row(s) for s in shown], "page": page, "more": len(rows) > limit * page}
