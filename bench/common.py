"""What every benchmark shares: its own database, pgbench's figure, dispatcher processes.

Importing this module points ``DATABASE_URL`` at ``<DATABASE_URL name>_bench`` (made anew by
``recreate_database``), so benchmarks never touch a real database, and sets the Django
settings module to the test project's (whose workflows the dispatchers autodiscover).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
BASE_URL = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/pgbus_workflows").split("?")[0]
BENCH_URL = BASE_URL if BASE_URL.endswith("_bench") else BASE_URL + "_bench"
os.environ["DATABASE_URL"] = BENCH_URL
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
#: Seconds a measurement waits after its dispatchers (workers) registered: their LISTEN, first claim.
SETTLE_SECONDS = 0.5

import django  # noqa: E402 - the environment must be set first
import environ  # noqa: E402


def psql_args(url: str = BENCH_URL) -> tuple[list[str], str]:
    """pgbench/psql connection flags and the database name of ``url``."""
    config = environ.Env.db_url_config(url)
    flags = ["-h", config.get("HOST") or "127.0.0.1", "-p", str(config.get("PORT") or 5432)]
    if config.get("USER"):
        flags += ["-U", config["USER"]]
    return flags, config["NAME"]


def admin_connection() -> Any:
    """An autocommit connection to the server's ``postgres`` database."""
    import psycopg

    config = environ.Env.db_url_config(BENCH_URL)
    return psycopg.connect(
        dbname="postgres",
        host=config.get("HOST") or "127.0.0.1",
        port=config.get("PORT") or 5432,
        user=config.get("USER") or None,
        password=config.get("PASSWORD") or None,
        autocommit=True,
    )


def recreate_database() -> None:
    """Drop and create the bench database, set Django up on it and migrate it."""
    from django.apps import apps
    from django.db import connections

    if apps.ready:
        connections.close_all()
    _, name = psql_args()
    with admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def drop_database() -> None:
    """Drop the bench database (after closing Django's connections to it)."""
    from django.db import connections

    connections.close_all()
    _, name = psql_args()
    with admin_connection() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def checkpoint() -> None:
    """CHECKPOINT: each measurement starts a checkpoint cycle of its own.

    The measurements before it (``pgbench -i``, ``start_many()``'s tens of thousands of runs)
    leave WAL behind that brings on a checkpoint in the middle of whichever comes next, with
    its writes to the disk: that one was measured slower, whatever it measured.
    """
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    except DatabaseError as error:  # a role neither superuser nor in pg_checkpoint (PostgreSQL 15+)
        print(f"bench: no CHECKPOINT before the measurement ({str(error).strip()})", file=sys.stderr)


def pgbench_tps(clients: int, seconds: int) -> float:
    """``pgbench -N`` (simple update) transactions per second on the bench database."""
    flags, name = psql_args()
    subprocess.run(["pgbench", "-i", "-q", "-s", "1", *flags, name], check=True, capture_output=True)
    out = subprocess.run(
        ["pgbench", "-N", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds), *flags, name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r"tps = ([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"no tps in pgbench output:\n{out}")
    return float(match.group(1))


def python_reference_ms() -> float:
    """This machine's pure-Python speed: the best of 20 sums of 100,000 integers, in ms.

    pgbench is C and the server's, so its ratio hides how fast Python runs here: this row tells
    runs on different machines apart (a figure of our own, client or dispatcher, is mostly Python).
    """
    import timeit

    return min(timeit.repeat("sum(range(100_000))", number=1, repeat=20)) * 1000


def start_dispatchers(
    count: int, concurrency: int, settings: dict[str, Any] | None = None
) -> list[subprocess.Popen[bytes]]:
    """Dispatcher processes on the bench database, without the sweep (``settings``: PGBUS_WORKFLOWS keys)."""
    root = os.environ.get(DISPATCHER_CHECKOUT) or str(ROOT)  # another checkout's code (bench.limits --against)
    env = {**os.environ, "PYTHONPATH": root, "PGBUS_WORKFLOWS_JSON": json.dumps(settings or {})}
    command = [sys.executable, "-m", "django", "run_workflow_dispatcher", "--no-sweep", "-v", "0"]
    return [subprocess.Popen([*command, "--concurrency", str(concurrency)], cwd=root, env=env) for _ in range(count)]


#: The environment variable naming another checkout whose code the dispatchers run (a baseline).
DISPATCHER_CHECKOUT = "PGBUS_BENCH_DISPATCHER_CHECKOUT"


def stop(processes: Sequence[subprocess.Popen[Any]]) -> None:
    """SIGTERM and wait; SIGKILL what is still running after a minute (or is already exiting)."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_registered(count: int) -> None:
    """Until ``count`` dispatchers have their row (they are ready to claim)."""
    from pgbus_workflows.models import Dispatcher

    wait_until(lambda: Dispatcher.objects.count() >= count, 120, f"{count} dispatchers registering", 0.05)


def wait_until(done: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    """Call ``done()`` every ``interval`` seconds until it is true; ``TimeoutError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(interval)


def run_json(command: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> Any:
    """Run a client process to its end and return the JSON document of its last line of stdout."""
    result = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def quantiles_ms(seconds: Sequence[float], *percents: int) -> list[float]:
    """The ``percents`` percentiles of ``seconds``, in milliseconds (``statistics.quantiles``, exclusive)."""
    cuts = statistics.quantiles([s * 1000 for s in seconds], n=100)
    return [cuts[p - 1] for p in percents]


def paired_trickles(runs: int, repeat: int, prepare: Callable[[], Any]) -> tuple[list[float], list[float]]:
    """Steps/s of ``bench.trickle``'s trickles (a dispatcher of four): the baseline's, and those after ``prepare()``.

    Paired by repetition, in an order alternating from one repetition to the next; each on a
    database made anew, never analysed: what one trickle leaves (its rows, a vacuum's or an
    ANALYZE's statistics) would otherwise outlive it into the next.
    """
    from bench.trickle import trickle

    plain: list[float] = []
    prepared: list[float] = []
    for repetition in range(repeat):
        for after in (False, True) if repetition % 2 == 0 else (True, False):
            recreate_database()
            if after:
                prepare()
            (prepared if after else plain).append(trickle(runs, 1, 4).steps_per_s)
    return plain, prepared


def print_paired(
    heading: str, baseline: tuple[str, Sequence[float]], other: tuple[str, Sequence[float]], figure: str = "{:,.0f}"
) -> None:
    """A Markdown table of two series (steps/s, or ``figure``'s format) paired by repetition, and their ratios."""
    ratios = paired_ratios(baseline[1], other[1])
    print(f"| {heading} | each repetition | median |")
    print("|---|---|---:|")
    for what, values, shown in (
        (f"{baseline[0]} (baseline)", baseline[1], figure),
        (other[0], other[1], figure),
        ("ratio, paired by repetition", ratios, "{:.2f}"),
    ):
        each = " / ".join(shown.format(value) for value in values)
        print(f"| {what} | {each} | {shown.format(statistics.median(values))} |")


def paired_ratios(baseline: Sequence[float], other: Sequence[float]) -> list[float]:
    """Each of ``other`` over ``baseline``'s of the same repetition."""
    return [after / before for before, after in zip(baseline, other, strict=True)]


def paired_median(baseline: Sequence[float], other: Sequence[float]) -> float:
    """The median of :func:`paired_ratios`."""
    return statistics.median(paired_ratios(baseline, other))
