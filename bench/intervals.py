"""How far a median of a few paired ratios can be trusted: the sign test's interval, nothing assumed.

A benchmark that compares two configurations on this machine pairs their measurements a
minute apart and takes the median of the ratios (``bench.common.paired_ratios``). Two
configurations that do the same work on the same saturated cores come out above 1 in about
half of the runs, so "median ≥ 1" alone cannot tell "no slower" from "slower by a little";
this interval says which of the two a run has shown. This module imports no database code (as
``bench.common`` does, pointing ``DATABASE_URL`` at the bench database), so tests may import it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """A confidence interval of a median: its bounds, and the probability that it holds the true median."""

    low: float
    high: float
    coverage: float


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """The narrowest order-statistic interval of the median of ``values`` that covers at least ``confidence``.

    The k-th smallest and the k-th largest value hold the true median unless fewer than k
    of the n values fall on one side of it: coverage 1 - 2 P(Binomial(n, 1/2) < k), whatever
    the values' distribution (the sign test's interval). For six values only the smallest
    and the largest reach 95 % (96.9 %); None when even they do not (five values or fewer).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence}")
    ordered = sorted(values)
    count = len(ordered)
    found = None
    for k in range(1, count // 2 + 1):
        coverage = 1 - 2 * sum(math.comb(count, below) for below in range(k)) / 2**count
        if coverage < confidence:
            break
        found = Interval(ordered[k - 1], ordered[count - k], coverage)
    return found


def no_slower(ratios: Sequence[float], confidence: float = 0.95) -> str:
    """The verdict on "no slower than the baseline" from ``ratios`` (each over the baseline's, paired).

    "yes" when their median is at least 1; otherwise "**no**", and, when the median's
    interval (:func:`median_interval`) still holds 1, that the run did not show it slower.
    """
    if statistics.median(ratios) >= 1:
        return "yes"
    interval = median_interval(ratios, confidence)
    if interval is not None and interval.high >= 1:
        return "**no**; not shown slower: the interval holds 1"
    return "**no**"


def described(ratios: Sequence[float], confidence: float = 0.95) -> str:
    """``ratios``' median's interval in words ("0.81 to 1.15, the median's 97 % interval"), or their range."""
    interval = median_interval(ratios, confidence)
    if interval is None:
        return f"{min(ratios):.2f} to {max(ratios):.2f}, too few for a {confidence:.0%} interval"
    return f"{interval.low:.2f} to {interval.high:.2f}, the median's {interval.coverage:.0%} interval"
