"""Prometheus metrics (the ``pgbus-workflows[prometheus]`` extra), from two kinds of process.

What the database knows, served by the web process's :func:`metrics_view` (or any registry
:class:`DatabaseCollector` is registered on), read at each scrape, the same whichever process
serves it:

- ``pgbus_workflows_runs{workflow_class, status}``: runs by class and status;
- ``pgbus_workflows_stuck_runs{workflow_class, reason}``: runs by class and stuck reason;
- ``pgbus_workflows_holds{kind, name}``: 1 for each class or queue an operator holds;
- ``pgbus_workflows_dispatcher_up{dispatcher, hostname}``: 1 while a registered dispatcher
  heartbeats within ``DISPATCHER_DEAD_AFTER``, else 0; ``pgbus_workflows_dispatcher_heartbeat_age_seconds``
  and ``pgbus_workflows_dispatcher_workers_alive`` with the same labels;
- ``pgbus_workflows_dispatchers_live``: how many dispatchers heartbeat;
- ``pgbus_workflows_read_lag_seconds``: how far behind the primary the ``READ_DATABASE`` the runs'
  counts were read from is (only when it is not the primary; the dispatchers' liveness is read
  on the primary, so an alert on it never waits for a replica).

What one process did, counted in it from the Django signals of ``signals.py`` once
:func:`install` connected them (``run_workflow_dispatcher --metrics-port`` does, and serves
them with prometheus_client's own HTTP server):

- ``pgbus_workflows_attempts_total{workflow_class, step, outcome}``: attempts this process ended;
- ``pgbus_workflows_step_duration_seconds{workflow_class, step}``: their durations, claim to end;
- ``pgbus_workflows_schedule_failures_total``: schedule ticks that could not start their run (which
  schedules fail: their ``last_error``, and the schedule admin's "failing" badge).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.metrics_core import GaugeMetricFamily, Metric
except ImportError as error:
    raise ImportError(
        "pgbus_workflows.metrics needs prometheus-client: pip install 'pgbus-workflows[prometheus]'"
    ) from error

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from . import signals
from .conf import settings
from .models import Dispatcher, WorkflowHold
from .models.reading import reading
from .services.stuck import gauge
from .sql import clock
from .sql.replica import read_lag

#: Seconds buckets of the step durations: a 5 ms body to an hour-long one.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

ATTEMPTS = Counter(
    "pgbus_workflows_attempts",
    "Step attempts this process ended, by class, step and outcome.",
    ["workflow_class", "step", "outcome"],
)
# No labels: the series exists (at 0) from the start, so an alert on its rate() needs no first failure.
SCHEDULE_FAILURES = Counter(
    "pgbus_workflows_schedule_failures", "Schedule ticks this process could not start a run for."
)
STEP_DURATION = Histogram(
    "pgbus_workflows_step_duration_seconds",
    "Seconds from an attempt's claim to its end, for the attempts this process ended.",
    ["workflow_class", "step"],
    buckets=DURATION_BUCKETS,
)


class DatabaseCollector:
    """Runs by class and status and by stuck reason (``sweep.gauge``), and dispatcher liveness."""

    def describe(self) -> list[Metric]:
        """Nothing: registering it must not query the database (prometheus_client calls this then)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The counts, read now from ``READ_DATABASE`` (and its lag, unless the primary); liveness from the primary."""
        now = clock.now()
        with reading() as alias:
            counts, lag = list(self._counts(now)), read_lag(alias)
        yield from counts
        if lag.elsewhere:
            yield GaugeMetricFamily(
                "pgbus_workflows_read_lag_seconds",
                "Seconds the READ_DATABASE the counts were read from is behind the primary (NaN: unknown).",
                value=math.nan if lag.seconds is None else lag.seconds,
            )
        yield from _dispatchers(now)

    def _counts(self, now: Any) -> Iterator[Metric]:
        payload = gauge(now)
        runs = GaugeMetricFamily(
            "pgbus_workflows_runs", "Workflow runs by class and status.", labels=["workflow_class", "status"]
        )
        for row in payload["statuses"]:
            runs.add_metric([row["workflow_class"], row["status"]], row["count"])
        stuck = GaugeMetricFamily(
            "pgbus_workflows_stuck_runs",
            "Workflow runs by class and stuck reason "
            "(stalled, overdue, waiting_overdue, paused_on_error, fan_out_unresolved).",
            labels=["workflow_class", "reason"],
        )
        for row in payload["stuck"]:
            stuck.add_metric([row["workflow_class"], row["reason"]], row["count"])
        held = GaugeMetricFamily(
            "pgbus_workflows_held_back_steps",
            "Steps due now and held back by a Concurrency or RateLimit with no room, by class and step.",
            labels=["workflow_class", "step"],
        )
        for row in payload["held_back"]:
            held.add_metric([row["workflow_class"], row["step"]], row["count"])
        holds = GaugeMetricFamily(
            "pgbus_workflows_holds",
            "1 for each workflow class or queue an operator holds (no step of it is claimed).",
            labels=["kind", "name"],
        )
        for kind, name in WorkflowHold.objects.active().order_by("kind", "name").values_list("kind", "name"):
            holds.add_metric([kind, name], 1)
        yield runs
        yield stuck
        yield held
        yield holds


def _dispatchers(now: Any) -> Iterator[Metric]:
    """The registered dispatchers' liveness, from their heartbeats."""
    labels = ["dispatcher", "hostname"]
    up = GaugeMetricFamily(
        "pgbus_workflows_dispatcher_up",
        "1 while the dispatcher heartbeats within DISPATCHER_DEAD_AFTER, else 0.",
        labels=labels,
    )
    age = GaugeMetricFamily(
        "pgbus_workflows_dispatcher_heartbeat_age_seconds", "Seconds since the dispatcher's heartbeat.", labels=labels
    )
    workers = GaugeMetricFamily(
        "pgbus_workflows_dispatcher_workers_alive", "Worker threads alive in the dispatcher.", labels=labels
    )
    dead_after = settings.DISPATCHER_DEAD_AFTER.total_seconds()
    live = 0
    rows = Dispatcher.objects.order_by("name").values_list("name", "hostname", "heartbeat_at", "workers_alive")
    for name, hostname, heartbeat_at, workers_alive in rows:
        seconds = max((now - heartbeat_at).total_seconds(), 0.0)
        alive = seconds <= dead_after
        live += alive
        up.add_metric([name, hostname], 1 if alive else 0)
        age.add_metric([name, hostname], seconds)
        workers.add_metric([name, hostname], workers_alive)
    yield up
    yield age
    yield workers
    yield GaugeMetricFamily(
        "pgbus_workflows_dispatchers_live", "Dispatchers heartbeating within DISPATCHER_DEAD_AFTER.", value=live
    )


def database_registry() -> CollectorRegistry:
    """A registry of its own holding only a :class:`DatabaseCollector`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return registry


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """What the database knows (:class:`DatabaseCollector`), in the format the scraper asks for.

    It does no access check of its own: mount it behind the project's authentication or
    network rules (see docs/metrics.md).
    """
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(database_registry()), content_type=content_type)


def _step_finished(sender: str, step_name: str, outcome: str, duration: float | None, **_: Any) -> None:
    """Count an attempt this process ended (every end records an outcome), and its duration when it started."""
    ATTEMPTS.labels(sender, step_name, outcome).inc()
    if duration is not None:
        STEP_DURATION.labels(sender, step_name).observe(duration)


def _schedule_failed(sender: str, **_: Any) -> None:
    """Count a schedule tick that failed (``signals.schedule_failed``)."""
    SCHEDULE_FAILURES.inc()


def install() -> None:
    """Count the attempts this process ends (``pgbus_workflows_attempts_total`` and durations).

    Connects a receiver to ``signals.step_finished``; calling it again changes nothing.
    """
    signals.step_finished.connect(_step_finished, dispatch_uid="pgbus_workflows.metrics")
    signals.schedule_failed.connect(_schedule_failed, dispatch_uid="pgbus_workflows.metrics.schedules")


def serve(port: int, address: str = "0.0.0.0") -> None:  # noqa: S104 - a scrape target listens for its scraper
    """:func:`install`, then serve prometheus_client's default registry on ``address:port`` (a thread)."""
    install()
    prometheus_client.start_http_server(port, addr=address)
