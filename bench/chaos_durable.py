"""The chaos harness's durable runs (``--durable N``): a durable function run through the same kills.

``chaos_durable`` (tests/testapp/chaos_workflows.py) loops over checkpoints, branches on what
they recorded, sleeps and waits for the signal ``go`` that the harness sends. Its bodies write a
``ChaosRecord`` of kind ``durable`` each time they run, keyed by their checkpoint. The promises,
checked from the rows once every run ended:

- every checkpoint recorded once: one completed attempt per checkpoint name, the expected names;
- no body run twice except one in flight at a kill: a checkpoint's body ran at most once more
  than the number of its attempts that stalled (a killed dispatcher's attempts stall; a
  function's row, which takes a checkpoint's name only with its outcome, counts for the
  checkpoint reached next after it stalled);
- every run finished with the right result (from its ``pages`` and the signal's payload).
"""

from __future__ import annotations

from collections import Counter, defaultdict

#: The durable function's registered name.
CLASS = "chaos_durable"


def pages_of(number: int) -> int:
    """How many loop checkpoints run ``number`` has: 3 to 7, so both branches are taken."""
    return 3 + number % 5


def start(runs: int) -> None:
    """Start ``runs`` runs of the durable function."""
    from tests.testapp.chaos_workflows import chaos_durable

    for number in range(runs):
        chaos_durable.start(None, pages=pages_of(number))


def check(runs: int, violations: list[str]) -> int:
    """Every promise, from the rows; returns how many bodies ran again after a kill."""
    from pgbus_workflows.functions import ENTRY
    from pgbus_workflows.models import WorkflowRun, WorkflowSignal, WorkflowStep
    from pgbus_workflows.services.lineage import run_result
    from tests.testapp.chaos_workflows import expected_durable_checkpoints, expected_durable_result
    from tests.testapp.models import ChaosRecord

    rows = [
        (run.pk, run.workflow_id, run.status, run.arguments, run_result(run))
        for run in WorkflowRun.objects.filter(workflow_class=CLASS)
    ]
    statuses = Counter(status for _, _, status, _, _ in rows)
    if statuses.get("finished", 0) != runs or len(rows) != runs:
        violations.append(f"durable: not every run finished: {dict(statuses)}")
    completed: dict[int, list[str]] = defaultdict(list)
    stalled: dict[int, Counter[str]] = defaultdict(Counter)
    unnamed: Counter[int] = Counter()  # stalled function rows not yet followed by a checkpoint's
    for run_pk, name, status, outcome in (
        WorkflowStep.objects.filter(run__workflow_class=CLASS)
        .order_by("pk")
        .values_list("run_id", "step_name", "status", "outcome")
    ):
        if name == ENTRY:
            if outcome == "stalled":
                unnamed[run_pk] += 1
            continue
        # A function's row takes a checkpoint's name with its outcome: one stalled before was in
        # flight in the checkpoint the function reached next, its retry.
        stalled[run_pk][name] += unnamed.pop(run_pk, 0)
        if status == "completed" and outcome == "success":
            completed[run_pk].append(name)
        elif outcome == "stalled":
            stalled[run_pk][name] += 1
    executions: dict[str, Counter[str]] = defaultdict(Counter)
    for run_key, key in ChaosRecord.objects.filter(kind="durable").values_list("run_key", "key"):
        executions[run_key][key.rsplit(":", 1)[-1]] += 1
    signals = Counter(WorkflowSignal.objects.filter(run__workflow_class=CLASS).values_list("run_id", flat=True))
    reran = 0
    for run_pk, workflow_id, _, arguments, result in rows:
        pages = arguments["pages"]
        expected = expected_durable_checkpoints(pages)
        if completed[run_pk] != expected:
            violations.append(f"durable run pk {run_pk}: completed checkpoints {completed[run_pk]}, not {expected}")
        if result != expected_durable_result(pages, {"run": run_pk}):
            violations.append(f"durable run pk {run_pk}: result {result!r}")
        for checkpoint, count in executions[str(workflow_id)].items():
            if count > 1 + stalled[run_pk][checkpoint]:
                violations.append(
                    f"durable run pk {run_pk}: {checkpoint}'s body ran {count} times, "
                    f"{stalled[run_pk][checkpoint]} attempt(s) stalled"
                )
            reran += count - 1
        bodies = set(expected) - {"breathe", "go"}
        if set(executions[str(workflow_id)]) != bodies:
            violations.append(f"durable run pk {run_pk}: bodies that ran {sorted(executions[str(workflow_id)])}")
        if signals.get(run_pk, 0) != 1:
            violations.append(f"durable run pk {run_pk}: {signals.get(run_pk, 0)} signal rows (one idempotency key)")
    return reran
