"""Reading Prometheus exposition text back, with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """``{(sample name, sorted labels): value}`` of an exposition text."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(table: Samples, name: str, **labels: str) -> float:
    """One sample of a :func:`samples` table; 0 when the series does not exist (yet)."""
    return table.get((name, tuple(sorted(labels.items()))), 0.0)
