"""The rollups' periods, and how a window's start is read from them.

Both rollups (``services.rollups``, ``services.run_hours``) are kept by hour for as long as the
history, and by five-minute span for the last ``SPANS_KEPT``. A window ``(since, now]`` is read
(:func:`window_start`) as whole hours from the hour boundary nearest its start, the spans
between that hour and the span boundary nearest its start (added or taken off), and the rows
themselves between that span boundary and ``since`` (added or taken off): at most half a span
of attempts or runs, however busy the hour. Where no span covers the start (just after an
upgrade), the rows between the nearest hour boundary and ``since``: up to half an hour of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

HOUR = timedelta(hours=1)
#: The short period: a window's start is read from the rows at most half of one away.
SPAN = timedelta(minutes=5)
#: How long spans are kept: the longest insights window (``services.insights.WINDOWS``) and an hour.
SPANS_KEPT = timedelta(days=7) + HOUR


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour ``moment`` is in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(moment: datetime) -> datetime:
    """The first hour start at or after ``moment``."""
    start = floor_hour(moment)
    return start if start == moment else start + HOUR


def floor_span(moment: datetime) -> datetime:
    """The start of the five-minute span ``moment`` is in (spans start on the UTC hour)."""
    moment = moment.astimezone(UTC)
    return moment.replace(minute=moment.minute - moment.minute % 5, second=0, microsecond=0)


def ceil_span(moment: datetime) -> datetime:
    """The first span start at or after ``moment``."""
    start = floor_span(moment)
    return start if start == moment else start + SPAN


@dataclass(frozen=True)
class WindowStart:
    """How a window's start ``since`` is read: hours from ``hour`` on, spans up to ``boundary``, then rows."""

    since: datetime
    #: The first whole hour read.
    hour: datetime
    #: The period boundary nearest ``since`` that is read from rolled-up rows (``hour``: no spans).
    boundary: datetime

    def spans(self) -> tuple[datetime, datetime, int] | None:
        """The spans between ``hour`` and ``boundary``: first and last start (both included), and their sign."""
        if self.boundary > self.hour:
            return self.hour, self.boundary - SPAN, -1
        if self.boundary < self.hour:
            return self.boundary, self.hour - SPAN, 1
        return None

    def rows(self) -> tuple[dict[str, datetime], int]:
        """The rows between ``boundary`` and ``since``: lookups on their time, and their sign."""
        if self.boundary <= self.since:
            return {"gte": self.boundary, "lte": self.since}, -1
        return {"gt": self.since, "lt": self.boundary}, 1


def window_start(since: datetime, until: datetime, spans_from: datetime | None) -> WindowStart:
    """The cheapest way to read a window from ``since``, the rollup going up to ``until`` (``since < until``).

    A boundary past ``until`` would count rows the part after ``until`` counts again; spans
    before ``spans_from`` may not exist. Fewest rows first, then fewest spans.
    """
    options = [WindowStart(since, hour, hour) for hour in {floor_hour(since), ceil_hour(since)} if hour <= until]
    if spans_from is not None:
        for boundary in {floor_span(since), ceil_span(since)}:
            for hour in {floor_hour(boundary), ceil_hour(boundary)}:
                if boundary <= until and min(boundary, hour) >= spans_from:
                    options.append(WindowStart(since, hour, boundary))
    return min(options, key=lambda start: (abs(start.boundary - since), abs(start.hour - start.boundary)))
