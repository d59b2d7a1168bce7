"""Chaos harness: SIGKILL dispatchers (and optionally restart PostgreSQL) while runs go on; check nothing is lost.

    .venv/bin/python bench/chaos.py [--runs 1000] [--dispatchers 3] [--kill-every 2] [--restart-postgres]
                                    [--faults exit,nul,hang,skew | --faults all] [--schedule] [--durable N]

It starts K dispatcher processes, starts N runs of ``ChaosWorkflow`` (tests/testapp/chaos_workflows.py:
an atomic step that inserts a row, a step that records its ``step_idempotency_key``, a flaky
step reattempted by a policy, a step waiting for a signal that this process delivers, a
fan-out of three jobs, a fan-out of two child runs). As soon as a body has run it SIGKILLs a
random dispatcher and starts a new one, and again every ``--kill-every`` seconds. At the end it
checks every promise and prints a summary; the exit status is non-zero on any violation.

``--faults`` adds faults from inside the process, on top of the kills and the restart: one run
in five has a body that raises ``SystemExit`` (``exit``) and an output with a NUL character
(``nul``) on their first attempts, one in twenty an atomic body that hangs past its
``timeout=`` (``hang``); and with ``skew`` (Debian's faketime) one dispatcher's clock runs a
minute ahead and another's a minute behind. ``--schedule`` adds an every-second schedule
(``bench/chaos_schedule.py``): every tick must have exactly one run, none lost, all finished.
``--durable N`` adds N runs of a durable function (``bench/chaos_durable.py``: loops of
checkpoints, a branch, a sleep, a signal wait): every checkpoint recorded once, no body run
twice but one in flight at a kill, every result right.
The database is ``<DATABASE_URL name>_chaos``, made anew.
``run_chaos()`` is also called by the test suite in a short mode, on its test database.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Short thresholds: a killed dispatcher is taken for dead within seconds.
CHAOS_SETTINGS = {
    "SWEEP_INTERVAL": 0.5,
    "HEARTBEAT_INTERVAL": 0.5,
    "DISPATCHER_DEAD_AFTER": 3,
    "POLL_INTERVAL": 0.5,
    "STALL_THRESHOLD": 20,
}


@dataclass
class ChaosReport:
    """What happened and what was violated."""

    runs: int
    seconds: float = 0.0
    kills: int = 0
    restarts: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    attempts: int = 0
    stalled: int = 0
    ticks: int = 0
    durable: int = 0
    reran: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """Printable lines."""
        lines = [
            f"runs: {self.runs}, seconds: {self.seconds:.1f}, dispatchers killed: {self.kills}, "
            f"postgres restarts: {self.restarts}",
            f"run statuses: {json.dumps(self.statuses, sort_keys=True)}",
            f"step attempts: {self.attempts} (stalled and reattempted: {self.stalled})",
        ]
        if self.durable:
            lines.append(f"durable runs: {self.durable}, checkpoint bodies run again after a kill: {self.reran}")
        if self.ticks:
            lines.append(f"schedule ticks fired: {self.ticks}, each once")
        if self.faults:
            lines.append(f"faults recorded: {json.dumps(self.faults, sort_keys=True)}")
        lines += [f"VIOLATION: {v}" for v in self.violations[:50]]
        lines.append("OK: every promise held" if not self.violations else f"{len(self.violations)} violation(s)")
        return "\n".join(lines)


class Dispatchers:
    """The dispatcher processes, killed and replaced at random."""

    def __init__(self, database_url: str, logs: Path, skew: bool = False) -> None:
        self.database_url = database_url
        self.logs = logs
        self.skew = skew
        self.processes: list[subprocess.Popen[bytes]] = []
        self.started = 0

    def _clock(self) -> dict[str, str]:
        """With ``skew``, of every three dispatchers started one runs a minute ahead, one behind."""
        if not self.skew or self.started % 3 == 0:
            return {}
        from tests.procs import skewed_clock

        return skewed_clock("+60s" if self.started % 3 == 1 else "-60s")

    def start(self) -> None:
        """One more dispatcher."""
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            "PGBUS_WORKFLOWS_JSON": json.dumps(CHAOS_SETTINGS),
        }
        self.started += 1
        env.update(self._clock())
        log = (self.logs / f"dispatcher-{self.started}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "django", "run_workflow_dispatcher", "--concurrency", "3", "-v", "1"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def kill_one(self) -> None:
        """SIGKILL a random live dispatcher and start a new one."""
        live = [p for p in self.processes if p.poll() is None]
        if live:
            victim = random.choice(live)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
        self.start()

    def stop_all(self) -> None:
        """SIGTERM every one, SIGKILL the ones that linger."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def deliver_signals(stop: threading.Event, errors: list[str]) -> None:
    """Another party: signal "go" to runs (some early, before they wait), each with an idempotency key."""
    from django.db import connection

    from pgbus_workflows.exceptions import NotOngoing

    try:
        while not stop.is_set():
            try:
                _signal_round()
            except NotOngoing:
                pass
            except Exception as error:  # a restarting database: try again next round
                errors.append(f"signal delivery: {error!r}")
                connection.close()
            stop.wait(0.2)
    finally:
        connection.close()


def _signal_round() -> None:
    """Signal up to 200 runs that have no signal yet."""
    from pgbus_workflows.exceptions import NotOngoing
    from pgbus_workflows.models import WorkflowRun, WorkflowSignal

    signalled = WorkflowSignal.objects.values("run_id")
    runs = list(
        WorkflowRun.objects.filter(workflow_class__in=SIGNALLED, status__in=["waiting", "ready", "performing"])
        .exclude(pk__in=signalled)
        .values_list("pk", flat=True)[:200]
    )
    for run_pk in runs:
        try:
            _deliver(run_pk)
        except NotOngoing:
            pass


#: The classes whose runs get the signal "go": the step class and the durable function.
SIGNALLED = ("chaos", "chaos_durable")


def _deliver(run_pk: int) -> None:
    from pgbus_workflows.services.signals import deliver_signal

    # Twice with one key: a webhook retry must not deliver twice.
    for _ in range(2):
        deliver_signal(run_pk, "go", {"run": run_pk}, idempotency_key=f"go-{run_pk}", actor="chaos")


def restart_postgres() -> None:
    """Restart the local cluster (the harness's --restart-postgres)."""
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"], check=True)


def run_chaos(
    database_url: str,
    runs: int = 1000,
    dispatchers: int = 3,
    kill_every: float = 2.0,
    restart: bool = False,
    timeout: float = 900.0,
    logs: Path | None = None,
    faults: frozenset[str] = frozenset(),
    schedule: bool = False,
    durable: int = 0,
    max_kills: int | None = None,
) -> ChaosReport:
    """Start the runs, kill dispatchers while they go, wait for the end, check. Django must be set up.

    ``faults``: any of :data:`FAULTS` (see the module docstring); ``schedule``: an every-second
    schedule fires throughout (``bench/chaos_schedule.py``); ``durable``: that many runs of a
    durable function (``bench/chaos_durable.py``); ``max_kills``: the kills stop after that many
    (a short run on a loaded machine, where dispatchers start slowly, still ends).
    """
    from django.db import connection

    from bench import chaos_durable, chaos_schedule
    from pgbus_workflows.models import WorkflowRun
    from tests.testapp.chaos_workflows import ChaosWorkflow

    report = ChaosReport(runs=runs, durable=durable)
    logs = logs or Path(tempfile.gettempdir()) / f"pgbus-chaos-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}: choose from {', '.join(FAULTS)}")
    pool = Dispatchers(database_url, logs, skew="skew" in faults)
    stop = threading.Event()
    errors: list[str] = []
    started = time.monotonic()
    for _ in range(dispatchers):
        pool.start()
    signaller = threading.Thread(target=deliver_signals, args=(stop, errors), daemon=True)
    ticking = chaos_schedule.add() if schedule else None
    try:
        for number in range(runs):
            ChaosWorkflow.start(faults=sorted(run_faults(number, faults)), lane=number % LANES)
        chaos_durable.start(durable)
        signaller.start()
        # The first kill lands as soon as a body has run (a dispatcher is mid-work), not after a
        # fixed delay: on a quick machine every run could end before it.
        next_kill: float | None = None
        restarted = not restart
        while time.monotonic() - started < timeout:
            try:
                ongoing = WorkflowRun.objects.ongoing().filter(workflow_class__in=SIGNALLED).count()
            except Exception:
                connection.close()
                ongoing = -1
            if ongoing == 0:
                break
            check_slots(report.violations)
            if next_kill is None and bodies_have_run():
                next_kill = time.monotonic()
            if (
                next_kill is not None
                and time.monotonic() >= next_kill
                and (max_kills is None or report.kills < max_kills)
            ):
                pool.kill_one()
                report.kills += 1
                next_kill = time.monotonic() + kill_every
            if not restarted and time.monotonic() - started > min(timeout / 20, 10.0):
                restart_postgres()
                connection.close()
                report.restarts += 1
                restarted = True
            time.sleep(0.1)
        if ticking is not None:
            chaos_schedule.settle(ticking, timeout=60)
    finally:
        stop.set()
        signaller.join(timeout=10)
        pool.stop_all()
    report.seconds = time.monotonic() - started
    check(report)
    check_faults(report, faults, logs)
    report.reran = chaos_durable.check(durable, report.violations)
    if ticking is not None:
        report.ticks = chaos_schedule.check(ticking, report.violations)
    return report


def bodies_have_run() -> bool:
    """Whether any step body has recorded that it ran (a database hiccup reads as not yet)."""
    from django.db import connection

    from tests.testapp.models import ChaosRecord

    try:
        return ChaosRecord.objects.exists()
    except Exception:
        connection.close()
        return False


#: The faults ``--faults`` can add: in the bodies (exit, nul, hang) and in the clocks (skew).
FAULTS = ("exit", "nul", "hang", "skew")


def run_faults(number: int, faults: frozenset[str]) -> set[str]:
    """The body faults run ``number`` carries: exit and nul one run in five, hang one in twenty."""
    chosen = set()
    if number % 5 == 0:
        chosen |= {"exit", "nul"} & faults
    if number % 20 == 0:
        chosen |= {"hang"} & faults
    return chosen


def check_faults(report: ChaosReport, faults: frozenset[str], logs: Path) -> None:
    """Each body fault ended in a recorded, reattempted attempt; no worker thread died."""
    from pgbus_workflows.models import WorkflowStep
    from tests.testapp.models import ChaosRecord

    v = report.violations
    hung = Counter(ChaosRecord.objects.filter(kind="hung").values_list("run_key", flat=True))
    if report.runs and (len(hung) != report.runs or set(hung.values()) != {1}):
        v.append(f"the atomic hang_once row of {report.runs} runs: {sorted(Counter(hung.values()).items())}")
    expected = {"exit": "SystemExit", "nul": "pgbus_workflows.exceptions.PayloadNotSerializable"}
    for fault, step_name in (("exit", "exit_once"), ("nul", "nul_output_once"), ("hang", "hang_once")):
        if fault not in faults:
            continue
        firsts = WorkflowStep.objects.filter(
            step_name=step_name, attempt=1, run__workflow_class="chaos", run__arguments__faults__contains=[fault]
        )
        report.faults[fault] = firsts.count()
        for error_class, outcome, message in firsts.values_list("error_class", "outcome", "error_message"):
            stalled = outcome == "stalled"  # a kill (or, for hang, its timeout) came first
            if fault == "hang" and not stalled:
                v.append(f"a hung atomic attempt ended {outcome}, not stalled: {message[:200]}")
            elif fault != "hang" and error_class != expected[fault] and not stalled:
                v.append(f"the {fault} fault ended as {error_class or outcome}, not {expected[fault]}")
        if fault == "hang":
            # Cut off by the database at 1 s, then stalled by whoever saw it first: the sweep
            # (stall_at), the worker itself (timeout), or a kill (dead_dispatcher).
            detections = Counter(
                message.rsplit(": ", 1)[-1] for message in firsts.values_list("error_message", flat=True)
            )
            report.faults.update({f"hang stalled by {d}": n for d, n in detections.items()})
    died = [log.name for log in sorted(logs.glob("dispatcher-*.log")) if b"died; recovering" in log.read_bytes()]
    if died:
        v.append(f"worker threads died in {died}")


#: The lanes the runs share (``ChaosWorkflow.concurrency``: three steps of a lane at once).
LANES = 10


def check_slots(violations: list[str], at_rest: bool = False) -> None:
    """Each lane's slots in use are its steps in progress, never above its limit (one snapshot).

    ``at_rest``: every run ended, so every slot must have been given back.
    """
    from django.db import DatabaseError, connection

    from pgbus_workflows.models import WorkflowLimiter, WorkflowStep

    limiters, steps = WorkflowLimiter._meta.db_table, WorkflowStep._meta.db_table
    query = (
        f'SELECT l.name, l.in_use, l."limit", (SELECT count(*) FROM {steps} s '
        f"WHERE s.status = 'in_progress' AND s.limiters ? l.name) FROM {limiters} l "
        "WHERE l.name LIKE 'concurrency:chaos-lane:%'"  # no parameters: the text is sent as it is
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute(query)
            lanes = cursor.fetchall()
    except DatabaseError:  # the server restarting: sampled again next time
        connection.close()
        return
    for name, in_use, limit, in_progress in lanes:
        if in_use != in_progress or in_use > limit or (at_rest and in_use):
            running = WorkflowStep.objects.filter(status="in_progress", limiters__contains=[name])
            steps = sorted(f"{n} #{a} ({by})" for n, a, by in running.values_list("step_name", "attempt", "claimed_by"))
            violations.append(f"{name}: {in_use} slots in use, {in_progress} in progress (limit {limit}): {steps}")


def check(report: ChaosReport) -> None:
    """Every promise, from the rows."""
    from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowSignal, WorkflowStep
    from pgbus_workflows.states import RUN_TRANSITIONS
    from tests.testapp.models import ChaosRecord

    chaos_runs = WorkflowRun.objects.filter(workflow_class="chaos")
    runs = {str(wid): pk for wid, pk in chaos_runs.values_list("workflow_id", "pk")}
    report.statuses = dict(Counter(WorkflowRun.objects.filter(workflow_class="chaos").values_list("status", flat=True)))
    v = report.violations
    if report.statuses.get("finished", 0) != report.runs:
        v.append(f"not every run finished: {report.statuses}")
    records: dict[str, dict[str, list[tuple[str, int]]]] = defaultdict(lambda: defaultdict(list))
    for kind, run_key, key, pid in ChaosRecord.objects.values_list("kind", "run_key", "key", "pid").iterator():
        records[kind][run_key].append((key, pid))
    for wid in runs:
        atomic = records["atomic"].get(wid, [])
        if len(atomic) != 1:
            v.append(f"run {wid}: the atomic step's row exists {len(atomic)} times")
        keys = {key for key, _ in records["key"].get(wid, [])}
        if keys != {f"{wid}:record_key"}:
            v.append(f"run {wid}: recorded idempotency keys {sorted(keys)}")
        jobs = {key for key, _ in records["job"].get(wid, [])}
        if jobs != {f"{wid}:{i}" for i in range(3)}:
            v.append(f"run {wid}: fan-out jobs that ran: {sorted(jobs)}")
        ran = {key for key, _ in records["child"].get(wid, [])}
        if ran != {f"{wid}:{i}" for i in range(2)}:
            v.append(f"run {wid}: children that ran: {sorted(ran)}")
        by_attempt: dict[str, set[int]] = defaultdict(set)
        for key, pid in records["execution"].get(wid, []):
            by_attempt[key].add(pid)
        for key, pids in by_attempt.items():
            if len(pids) > 1:
                v.append(f"run {wid}: attempt {key} ran in processes {sorted(pids)}")
    children = Counter(
        WorkflowRun.objects.filter(workflow_class="chaos_child", status="finished").values_list("parent_id", flat=True)
    )
    for run_pk in runs.values():
        _check_path(run_pk, RUN_TRANSITIONS, WorkflowEvent, v)
        if children.get(run_pk, 0) != 2:
            v.append(f"run pk {run_pk}: {children.get(run_pk, 0)} finished children, not 2 (none twice, none lost)")
    consumed = Counter(WorkflowSignal.objects.filter(run_id__in=runs.values()).values_list("run_id", flat=True))
    for run_pk in runs.values():
        if consumed.get(run_pk, 0) != 1:
            v.append(f"run pk {run_pk}: {consumed.get(run_pk, 0)} signal rows (one idempotency key)")
    check_slots(v, at_rest=True)
    report.attempts = WorkflowStep.objects.filter(run_id__in=runs.values()).count()
    report.stalled = WorkflowStep.objects.filter(run_id__in=runs.values(), outcome="stalled").count()


def _check_path(run_pk: int, table: dict[str, Any], events: Any, violations: list[str]) -> None:
    status = None
    for kind, transition, source, target in (
        events.objects.filter(run_id=run_pk)
        .exclude(to_status="")
        .order_by("pk")
        .values_list("kind", "transition", "from_status", "to_status")
    ):
        if kind == "started":
            status = target
            continue
        if source != status or (source, target) not in table.get(transition, ()):
            violations.append(f"run pk {run_pk}: event {kind} {transition} {source}->{target} after {status}")
            return
        status = target


def main() -> int:
    """Make the database, run the harness, print the summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--dispatchers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--restart-postgres", action="store_true")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--faults", default="", help=f"comma-separated, of {', '.join(FAULTS)}; or all")
    parser.add_argument("--schedule", action="store_true", help="an every-second schedule fires throughout")
    parser.add_argument("--durable", type=int, default=0, help="runs of a durable function, beside the others")
    args = parser.parse_args()
    faults = frozenset(FAULTS if args.faults == "all" else [f for f in args.faults.split(",") if f])

    base = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/pgbus_workflows").split("?")[0]
    url = base + "_chaos"
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path.insert(0, str(ROOT))
    _recreate(url)
    report = run_chaos(
        url,
        args.runs,
        args.dispatchers,
        args.kill_every,
        args.restart_postgres,
        args.timeout,
        faults=faults,
        schedule=args.schedule,
        durable=args.durable,
    )
    print(report.summary())
    return 1 if report.violations else 0


def _recreate(url: str) -> None:
    import django
    import environ
    import psycopg

    config = environ.Env.db_url_config(url)
    with psycopg.connect(
        dbname="postgres",
        host=config.get("HOST") or "127.0.0.1",
        port=config.get("PORT") or 5432,
        user=config.get("USER") or None,
        autocommit=True,
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{config["NAME"]}"')
        conn.execute(f'CREATE DATABASE "{config["NAME"]}"')
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


if __name__ == "__main__":
    sys.exit(main())
