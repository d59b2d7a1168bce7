"""What the tools take: each argument's type, its bounds and its choices, as the client's schema shows them.

The SDK validates every call against these before a tool runs: a value out of bounds or not
among the choices is a tool error naming the argument, and nothing is read. Pages are
bounded (:data:`MAX_LIMIT` rows, :data:`MAX_PAGE` pages), so no call reads more than
``MAX_LIMIT * MAX_PAGE`` rows of a list, whatever the history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from ..admin.forms import MAX_REASON_LENGTH
from ..dsl.limits import CONCURRENCY, RATE
from ..services.insights import WINDOWS
from ..services.limiters import ORDERS
from ..services.stuck import STUCK_REASONS
from ..states import RunStatus

#: The most rows one page of a list holds.
MAX_LIMIT = 100
#: The furthest page a list goes to: further back, narrow the filters instead.
MAX_PAGE = 10
#: The most workflow classes one filter names.
MAX_CLASSES = 20
#: The longest name a client may give: a workflow class, a step or a signal (as their columns hold them).
MAX_NAME_LENGTH = 255


def one_of(choices: Sequence[str], what: str) -> Callable[[str], str]:
    """A validator that accepts one of ``choices`` and names them all otherwise."""

    def check(value: str) -> str:
        if value not in choices:
            raise ValueError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
        return value

    return check


def rows_of_page(rows: list[Any], limit: int, page: int) -> list[Any]:
    """The rows of page ``page`` (from 1) of ``limit`` rows, out of the first ``limit * page`` rows."""
    return rows[(page - 1) * limit : page * limit]


#: Rows a page holds.
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"How many rows a page holds (1 to {MAX_LIMIT}).")]
#: Which page of a list, bounded so no call reads more than ``MAX_LIMIT * MAX_PAGE`` rows of it.
Page = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_PAGE,
        description=f"Which page of the list (1 to {MAX_PAGE}); further on, narrow the filters instead.",
    ),
]
#: A run, as ``find_run`` finds it (the CLI's ``RUN_ID``).
RunId = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=64),
    Field(description="A workflow id (its 32 hex digits, dashes or not), or its first 8 or more hex digits."),
]
#: The reason a write tool records, as long as the admin's form allows.
Reason = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REASON_LENGTH),
    Field(
        description=f"Why you act, in a sentence: recorded on the run's audit trail with who acted "
        f"(at most {MAX_REASON_LENGTH} characters)."
    ),
]
#: A name a column holds: a workflow class's, a step's, a signal's.
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME_LENGTH)]
#: One workflow class.
ClassName = Annotated[Name, Field(description="A workflow class's name (its ``name`` attribute).")]
#: A filter on workflow classes.
Classes = Annotated[
    list[ClassName],
    Field(max_length=MAX_CLASSES, description=f"Only these workflow classes (at most {MAX_CLASSES})."),
]
#: One run status.
StatusName = Annotated[
    str,
    AfterValidator(one_of(RunStatus.values, "status")),
    Field(json_schema_extra={"enum": list(RunStatus.values)}),
]
#: A filter on run statuses.
Statuses = Annotated[
    list[StatusName], Field(max_length=len(RunStatus.values), description="Only runs in these statuses.")
]
#: One of the reasons the gauge and the dashboard count a run as stuck.
StuckReason = Annotated[
    str,
    AfterValidator(one_of(STUCK_REASONS, "stuck reason")),
    Field(
        json_schema_extra={"enum": list(STUCK_REASONS)},
        description="Why a run counts as stuck: stalled (its attempt outlived its timeout or its dispatcher), "
        "overdue (a due step nobody took), waiting_overdue (waiting for a signal longer than "
        "WAITING_VISIBILITY_THRESHOLD, no timeout), paused_on_error, fan_out_unresolved (every job "
        "ended, the step not yet resolved).",
    ),
]
#: A subject as runs store it (``operating.runs.Subject.parse`` reads it).
SubjectText = Annotated[
    str,
    Field(max_length=300, description="app_label.model:pk (one subject, e.g. shop.order:42) or app_label.model."),
]
#: One of the insights page's windows.
WindowName = Annotated[
    str,
    AfterValidator(one_of(list(WINDOWS), "window")),
    Field(json_schema_extra={"enum": list(WINDOWS)}, description=f"How far back: {', '.join(WINDOWS)}."),
]
#: One kind of limiter.
LimiterKind = Annotated[
    str,
    AfterValidator(one_of([CONCURRENCY, RATE], "kind")),
    Field(
        json_schema_extra={"enum": [CONCURRENCY, RATE]},
        description="Only concurrency keys (Concurrency) or only rate limits (RateLimit).",
    ),
]
#: What the ``limits`` tool sorts the keys by.
LimitsOrder = Annotated[
    str,
    AfterValidator(one_of(ORDERS, "order")),
    Field(
        json_schema_extra={"enum": list(ORDERS)},
        description="held_back: the keys holding the most steps back first; in_use: the most slots in use "
        "(a rate limit: tokens spent) first.",
    ),
]
