"""``services.periods.window_start``: a window read from hours, spans and rows counts what the rows alone count.

Moments stand for attempts' ends; the hours and spans are counted as the rollup keeps them
(everything before ``until``; spans only from ``spans_from`` on), and the window's count put
together as insights put it together must be the count of the moments in ``(since, now]``,
wherever ``since``, ``until`` and ``spans_from`` fall. No database: the arithmetic alone.
"""

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from pgbus_workflows.services.periods import (
    HOUR,
    SPAN,
    ceil_span,
    floor_hour,
    floor_span,
    window_start,
)

ORIGIN = datetime(2026, 12, 7, tzinfo=UTC)
seconds = st.integers(min_value=0, max_value=6 * 3600)


def at(second: int) -> datetime:
    return ORIGIN + timedelta(seconds=second)


def read_window(ends, since, now, until, spans_from):
    """The moments in ``(since, now]``, counted as ``services.rollups.window_cells`` counts attempts."""
    hours = Counter(floor_hour(end) for end in ends if end < until)
    spans = Counter(floor_span(end) for end in ends if spans_from is not None and spans_from <= end < until)
    start = window_start(since, until, spans_from)
    total = sum(n for hour, n in hours.items() if start.hour <= hour <= floor_hour(until))
    if found := start.spans():
        first, last, sign = found
        total += sign * sum(n for span, n in spans.items() if first <= span <= last)
    rows, sign = start.rows()
    low, high = rows.get("gte", rows.get("gt")), rows.get("lte", rows.get("lt"))
    total += sign * sum(
        1
        for end in ends
        if (end >= low if "gte" in rows else end > low) and (end <= high if "lte" in rows else end < high)
    )
    return total + sum(1 for end in ends if until <= end <= now), start


@settings(max_examples=400, deadline=None)
@given(
    ends=st.lists(seconds, max_size=60),
    since=seconds,
    after=st.integers(min_value=1, max_value=3 * 3600),
    lag=st.integers(min_value=0, max_value=3600),
    spans_from=st.one_of(st.none(), seconds),
)
def test_a_window_read_from_the_rollup_counts_what_its_rows_count(ends, since, after, lag, spans_from):
    moments = [at(end) for end in ends] + [at(since), at(since + 150)]  # ends on the window's start too
    until = at(since + after)
    now = until + timedelta(seconds=lag)
    start_of_spans = None if spans_from is None else ceil_span(at(spans_from))

    counted, start = read_window(moments, at(since), now, until, start_of_spans)

    assert counted == sum(1 for end in moments if at(since) < end <= now)
    assert start.boundary <= until


@given(since=seconds, after=st.integers(min_value=SPAN.seconds, max_value=3 * 3600))
def test_rows_are_read_at_most_half_a_span_from_the_start_where_spans_cover_it(since, after):
    start = window_start(at(since), at(since + after), spans_from=ORIGIN - HOUR)

    assert abs(start.boundary - at(since)) <= SPAN / 2
    assert start.boundary in (floor_span(at(since)), ceil_span(at(since)))


@given(since=seconds, after=st.integers(min_value=HOUR.seconds, max_value=3 * 3600))
def test_without_spans_rows_are_read_at_most_half_an_hour_from_the_start(since, after):
    start = window_start(at(since), at(since + after), spans_from=None)

    assert abs(start.boundary - at(since)) <= HOUR / 2
    assert start.spans() is None
