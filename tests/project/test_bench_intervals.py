"""The benchmark's verdict on "no slower": the sign test's interval of a median of paired ratios."""

from __future__ import annotations

import math
import random

import pytest

from bench.intervals import described, median_interval, no_slower


def test_six_values_take_the_smallest_and_largest_at_97_percent() -> None:
    interval = median_interval([1.1, 0.8, 1.2, 0.9, 1.0, 0.95])
    assert interval is not None
    assert (interval.low, interval.high) == (0.8, 1.2)
    assert interval.coverage == pytest.approx(1 - 2 / 64)


def test_more_values_narrow_the_interval() -> None:
    values = [0.70, 0.80, 0.90, 0.95, 1.00, 1.05, 1.10, 1.15, 1.20, 1.40]
    interval = median_interval(values)
    assert interval is not None
    assert (interval.low, interval.high) == (0.80, 1.20)  # the 2nd smallest and 2nd largest of ten
    assert interval.coverage == pytest.approx(1 - 2 * (1 + 10) / 1024)
    assert median_interval(values, confidence=0.99) == median_interval(values, confidence=0.995)
    wide = median_interval(values, confidence=0.99)
    assert wide is not None and (wide.low, wide.high) == (0.70, 1.40)


def test_too_few_values_give_no_interval() -> None:
    assert median_interval([0.9, 1.0, 1.1, 0.95, 1.05]) is None  # five: even the extremes cover 94 %
    assert median_interval([]) is None
    assert "too few" in described([0.9, 1.1])
    with pytest.raises(ValueError, match="between 0 and 1"):
        median_interval([1.0] * 6, confidence=1)


def test_the_coverage_holds_for_samples_of_a_known_median() -> None:
    """Drawn from a skewed distribution whose median is 1: the interval misses it no more often than it says."""
    generator = random.Random(16)
    trials = 4000
    for count in (8, 10, 12):
        misses = 0
        coverage = 1.0
        for _ in range(trials):
            sample = [math.exp(generator.expovariate(1) - math.log(2)) for _ in range(count)]
            interval = median_interval(sample)
            assert interval is not None
            coverage = interval.coverage
            misses += not interval.low <= 1 <= interval.high
        assert misses / trials <= (1 - coverage) + 0.01, count


def test_the_verdict_says_yes_no_or_not_shown_slower() -> None:
    assert no_slower([0.9, 1.0, 1.1, 1.2, 1.05, 0.95]) == "yes"
    assert no_slower([0.81, 0.9, 0.95, 0.99, 1.02, 1.15]).startswith("**no**; not shown slower")
    assert no_slower([0.8, 0.85, 0.9, 0.92, 0.95, 0.97]) == "**no**"  # every pair slower: shown
    assert no_slower([0.9, 0.95, 1.2]) == "**no**"  # three pairs: no interval to judge by
    assert described([0.81, 0.9, 0.95, 0.99, 1.02, 1.15]) == "0.81 to 1.15, the median's 97% interval"
