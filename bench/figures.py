"""What a trickle measurement yields, for this project and its peers alike: one shape, one arithmetic."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import quantiles_ms

#: Steps (tasks) of one run (chain): NoOp3's three, Procrastinate's chain_a -> chain_b -> chain_c.
STEPS_PER_RUN = 3


@dataclass(frozen=True)
class Trickle:
    """One trickle measurement: steps/s from the first call to the last step finished, and each call's cost.

    ``lag`` is the seconds from the client's last call returning to the last step finishing:
    near zero, the drain kept up and the client's calls set the rate.
    """

    steps_per_s: float
    lag: float
    wall: list[float]
    cpu: list[float]

    @classmethod
    def from_report(cls, report: dict[str, Any], runs: int, last_finished: float) -> Trickle:
        """From a client's JSON report and the epoch seconds at which the last step finished (from rows)."""
        rate = STEPS_PER_RUN * runs / (last_finished - report["first_call"])
        return cls(rate, last_finished - report["last_return"], report["wall"], report["cpu"])


@dataclass(frozen=True)
class TrickleSummary:
    """Repeated trickle measurements: the median steps/s and lag; the calls of all (percentiles, mean CPU)."""

    steps_per_s: float
    lag: float
    call_p50_ms: float
    call_p99_ms: float
    cpu_ms: float

    @classmethod
    def of(cls, measurements: Sequence[Trickle]) -> TrickleSummary:
        """The median of the rates; the calls of all repetitions pooled."""
        walls = [w for m in measurements for w in m.wall]
        p50, p99 = quantiles_ms(walls, 50, 99)
        cpu = statistics.fmean(c for m in measurements for c in m.cpu) * 1000
        rate, lag = (statistics.median(getattr(m, name) for m in measurements) for name in ("steps_per_s", "lag"))
        return cls(rate, lag, p50, p99, cpu)


@dataclass(frozen=True)
class Latency:
    """Call-to-body delays at idle: percentiles, and the median of each phase of a sample, in ms."""

    p50: float
    p90: float
    p99: float
    #: the call returning (committed), then the claim (fetch), then the body's first line.
    phases: tuple[float, float, float]

    @classmethod
    def of(cls, report: dict[str, list[float]]) -> Latency:
        """From a client's report: per sample, seconds from the call to the body, its return and the claim."""
        p50, p90, p99 = quantiles_ms(report["latency"], 50, 90, 99)
        samples = list(zip(report["returned"], report["claimed"], report["latency"], strict=True))
        phases = (
            statistics.median(returned for returned, _, _ in samples) * 1000,
            statistics.median(claimed - returned for returned, claimed, _ in samples) * 1000,
            statistics.median(body - claimed for _, claimed, body in samples) * 1000,
        )
        return cls(p50, p90, p99, phases)
