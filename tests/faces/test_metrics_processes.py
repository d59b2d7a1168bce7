"""``run_workflow_dispatcher --metrics-port``: a real dispatcher process scraped over HTTP."""

import socket
import urllib.request

import pytest

from pgbus_workflows.models import WorkflowRun
from tests.exposition import Samples, samples, value
from tests.procs import ROOT, eventually
from tests.testapp.workflows import Counted, FailsFirst

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> Samples:
    """The endpoint's samples; none while it does not answer yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return samples(response.read().decode())
    except OSError:
        return {}


def attempts(port: int, **labels: str) -> float:
    return value(scrape(port), "pgbus_workflows_attempts_total", **labels)


def test_the_dispatcher_serves_the_attempts_it_ended(dispatchers):
    port = free_port()
    for _ in range(3):
        Counted.start()
    FailsFirst.start()
    process = dispatchers("--metrics-port", str(port))
    for name in ("first", "second", "third"):
        eventually(
            lambda name=name: attempts(port, workflow_class="counted", step=name, outcome="success") == 3,
            what=f"3 attempts of counted.{name} in the scrape\n{process.output()}",
        )
    eventually(lambda: attempts(port, workflow_class="fails_first", step="flaky", outcome="failed") == 1)
    table = scrape(port)
    labels = {"workflow_class": "counted", "step": "first"}
    assert value(table, "pgbus_workflows_step_duration_seconds_count", **labels) == 3
    # the database's counts are the web view's: many dispatchers would each report the same runs
    names = {name for name, _ in table}
    assert not any(name.startswith(("pgbus_workflows_runs", "pgbus_workflows_dispatcher")) for name in names)
    assert "process_cpu_seconds_total" in names  # prometheus_client's own process metrics come along
    assert WorkflowRun.objects.filter(status="finished").count() == 3
    assert f"Serving metrics on 0.0.0.0:{port}" in process.output()  # every interface unless --metrics-address


def test_a_taken_port_stops_the_dispatcher_with_one_line(dispatchers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = dispatchers("--metrics-port", str(port), "--metrics-address", "127.0.0.1")
        assert process.wait() == 1
    assert process.output().strip().splitlines()[-1] == (
        f"CommandError: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_without_the_extra_the_flag_names_it(dispatchers, tmp_path):
    (tmp_path / "prometheus_client.py").write_text("raise ImportError('No module named prometheus_client')\n")
    process = dispatchers("--metrics-port", str(free_port()), env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert process.wait() == 1
    assert process.output().strip().splitlines()[-1] == (
        "CommandError: pgbus_workflows.metrics needs prometheus-client: pip install 'pgbus-workflows[prometheus]'"
    )
