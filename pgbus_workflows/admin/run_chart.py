"""The run page's timeline as a picture: one bar per attempt on a time axis, laid out here so its
template (``run_page/timeline_chart.html`` of the app's templates) only draws it.

A bar is the attempt's life from its row's creation to its end (or now), in up to five parts:
*delayed* (created, not due yet: a ``wait=``, a reattempt's backoff), *queued* (due, not yet
claimed), *running*, *parked* (waiting for a signal or a fan-out) and, once woken, queued and
running again. The parts take the attempt's status colour, the running part solid.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..models import WorkflowStep
from .display import format_duration

LABEL_WIDTH = 200
AXIS_WIDTH = 640
ROW_HEIGHT = 22
BAR_HEIGHT = 14
AXIS_HEIGHT = 34
TICKS = 4
#: A running part shorter than this many pixels is drawn this wide, so a quick attempt shows.
MIN_RUNNING_WIDTH = 2.0

KIND_LABELS = {
    "delayed": gettext_lazy("delayed"),
    "queued": gettext_lazy("queued"),
    "running": gettext_lazy("running"),
    "parked": gettext_lazy("parked"),
}


def attempt_parts(step: WorkflowStep, now: datetime) -> list[tuple[str, datetime, datetime]]:
    """The ``(kind, start, end)`` parts of an attempt's life, in time order, none empty.

    The row keeps its latest claim in ``started_at`` and its wake-up in ``scheduled_at``, so
    a parked attempt that was woken shows running, parked, queued, running again.
    """
    end = step.finished_at or now
    parts: list[tuple[str, datetime, datetime]] = []
    if step.waiting_since is not None:
        first_run = step.started_at if step.started_at and step.started_at <= step.waiting_since else None
        woke = step.scheduled_at > step.waiting_since
        if first_run is not None:
            parts += [("queued", step.created_at, first_run), ("running", first_run, step.waiting_since)]
        else:  # woken and claimed again: the claim before the wait is no longer on the row
            parts.append(("queued", step.created_at, step.waiting_since))
        parts.append(("parked", step.waiting_since, step.scheduled_at if woke else end))
        if woke:
            claimed = step.started_at if first_run is None and step.started_at else None
            parts.append(("queued", step.scheduled_at, claimed or end))
            if claimed is not None:
                parts.append(("running", claimed, end))
    else:
        due = max(step.created_at, step.scheduled_at)
        if step.started_at is not None:
            parts += [("delayed", step.created_at, due), ("queued", due, step.started_at)]
            parts.append(("running", step.started_at, end))
        elif step.finished_at is not None:  # cancelled or skipped before it ran
            parts += [("delayed", step.created_at, min(due, end)), ("queued", due, end)]
        else:  # still to run: delayed until due (later than now, perhaps), then queued until now
            parts += [("delayed", step.created_at, due), ("queued", due, now)]
    return [(kind, start, stop) for kind, start, stop in parts if stop > start or kind == "running"]


def timeline_chart(steps: list[WorkflowStep], now: datetime, ongoing: bool) -> dict[str, Any]:
    """Bars for ``steps`` (in the order given, one row each) on one time axis, with its ticks."""
    lives = [(step, attempt_parts(step, now)) for step in steps]
    starts = [start for _step, parts in lives for _kind, start, _end in parts]
    ends = [end for _step, parts in lives for _kind, _start, end in parts]
    if ongoing:
        ends.append(now)
    first = min(starts, default=now)
    last = max(ends, default=now)
    span = max((last - first).total_seconds(), 1.0)

    def x(moment: datetime) -> float:
        return round(LABEL_WIDTH + AXIS_WIDTH * (moment - first).total_seconds() / span, 1)

    bars = []
    for index, (step, parts) in enumerate(lives):
        drawn = []
        for kind, start, end in parts:
            left, right = x(start), x(end)
            if kind == "running":
                right = max(right, left + MIN_RUNNING_WIDTH)
            title = _("%(kind)s %(duration)s, %(start)s to %(end)s") % {
                "kind": KIND_LABELS[kind],
                "duration": format_duration(end - start),
                "start": _clock(start),
                "end": _clock(end),
            }
            drawn.append({"kind": kind, "x": left, "width": round(right - left, 1), "title": title})
        bars.append({"step": step, "y": index * ROW_HEIGHT, "parts": drawn})
    height = len(bars) * ROW_HEIGHT
    moments = [first + timedelta(seconds=span * i / TICKS) for i in range(TICKS + 1)]
    # Within a day the time of day tells the ticks apart; the caption gives the dates.
    tick_format = "%H:%M:%S" if span < 86_400 else "%m-%d %H:%M"
    ticks = [{"x": x(moment), "label": timezone.localtime(moment).strftime(tick_format)} for moment in moments]
    return {
        "bars": bars,
        "ticks": ticks,
        "now_x": x(now) if ongoing and first <= now <= last else None,
        "width": LABEL_WIDTH + AXIS_WIDTH + 70,
        "height": height + AXIS_HEIGHT,
        "rows_height": height,
        "bar_height": BAR_HEIGHT,
        "label_x": LABEL_WIDTH - 8,
        "span": format_duration(last - first),
        "first": _clock(first),
        "last": _clock(last),
        "kinds": list(KIND_LABELS.items()),
    }


def _clock(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")
