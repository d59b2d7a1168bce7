"""The one module of hand-written SQL: every statement by name, run where Django sees it.

A step's claim and outcome are mostly pipelined statements; they must still go through
Django's cursor, so that execute wrappers, ``assertNumQueries`` and query logging see them.
And no statement is written anywhere else in the app (an AST scan of its source).
"""

import ast
from pathlib import Path

import psycopg
import pytest
from django.apps import apps
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from pgbus_workflows import sql
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.services.applying import apply_outcomes
from pgbus_workflows.services.chain import Chain
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step, perform_step
from pgbus_workflows.services.fanout import claim_due_jobs, execute_job
from pgbus_workflows.services.transactions import commit_once
from pgbus_workflows.sql import bulk
from pgbus_workflows.sql.statements import BUILDERS
from tests.support import round_trips, statements_sent
from tests.testapp.workflows import Counted, Squares

pytestmark = pytest.mark.django_db

PACKAGE = Path(sql.__file__).resolve().parent.parent
#: Modules allowed SQL of their own, and why.
OWN_SQL = {
    "schema.py": "DDL that migrations run (indexes, constraints), composed with psycopg.sql identifiers",
    "dispatcher/listener.py": "LISTEN on a channel: an identifier, composed with psycopg.sql (no parameter names it)",
}


def test_an_execute_wrapper_sees_every_statement_of_a_claim_and_an_outcome_pipelined_ones_too():
    Counted.start()
    with statements_sent() as seen:
        (claimed,) = claim_due_steps(10)
        execute_step(claimed)

    # (earlier tests may have taught this process names it cannot run: the filter then varies)
    assert any(a_claim(text) for text in seen)
    assert sql.statement("lock_pairs", WorkflowRun, WorkflowStep, "run_id") in seen  # a pipelined statement
    events = sql.statement("insert_many", WorkflowEvent, 1, (), False).split(" VALUES")[0]
    assert any(text.startswith(events) for text in seen)  # the batched writes (pipelined)
    assert sql.statement("notify") in seen


def test_query_counting_and_logging_see_the_pipelined_statements():
    Squares.start(count=2)
    (claimed,) = claim_due_steps(10)
    execute_step(claimed)

    with CaptureQueriesContext(connection) as queries:
        jobs = claim_due_jobs(10)

    assert len(jobs) == 2
    logged = [q["sql"] for q in queries.captured_queries]  # as sent: the values in place of %s

    def was_logged(name, *variant):
        head = sql.statement(name, *variant).split("%s")[0]
        return any(text.startswith(head) for text in logged)

    assert was_logged("due_jobs", False, False), logged
    assert was_logged("start_jobs"), logged  # run in a pipeline, on a server-binding cursor
    for job in jobs:
        execute_job(job)
    assert all(j.status == "succeeded" for j in type(jobs[0]).objects.all())


def test_every_builder_builds_and_the_cache_is_keyed_by_alias_and_vendor():
    samples = {
        "update": (WorkflowRun, ("status",)),
        "insert": (WorkflowStep, ()),
        "insert_many": (WorkflowStep, 2, ("id",), True),
        "unnest_insert": (WorkflowRun, ("id", "workflow_id"), True, ("workflow_class",)),
        "unnest_update": (WorkflowStep, ("status",)),
        "lock": (WorkflowRun, ("id",), True),
        "lock_pairs": (WorkflowRun, WorkflowStep, "run_id"),
        "claim_steps": (True, 2, True),
        "due_jobs": (True, True),
        "look_ahead": (True,),
        "start_function": ("public.pgbus_wf_start_run_sample",),
        "start_call": ("public.pgbus_wf_start_run_sample",),
    }
    for name in BUILDERS:
        text = sql.statement(name, *samples.get(name, ()))
        assert isinstance(text, str) and text.strip(), name
    assert all(key[:2] == (connection.alias, connection.vendor) for key in sql._cache)
    claim = sql.statement("claim_steps", False, 0, False)
    assert "'scheduled'" in claim and "'ready'" in claim and "'in_progress'" in claim and "'performing'" in claim
    assert "varchar(" not in sql.statement("unnest_update", WorkflowStep, ("step_name",))  # no length in casts


def _executes_literal_sql(tree: ast.AST) -> list[int]:
    """Lines of ``.execute(...)`` calls whose statement is written right there (a literal or f-string)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "execute":
            if node.args and isinstance(node.args[0], ast.Constant | ast.JoinedStr):
                lines.append(node.lineno)
    return lines


def test_no_module_outside_sql_writes_a_statement_of_its_own():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(("sql/", "migrations/")) or relative in OWN_SQL:
            continue
        lines = _executes_literal_sql(ast.parse(path.read_text()))
        if lines:
            offenders[relative] = lines
    assert offenders == {}, f"hand-written SQL outside pgbus_workflows/sql: {offenders}"


#: Modules that ask about the database vendor themselves: the schema's own DDL, and the system
#: checks (which report on the vendor).
OWN_VENDOR = {"schema.py", "checks.py"}


def _vendor_branches(tree: ast.AST) -> list[int]:
    """Lines that compare ``<something>.vendor`` with a value: a branch on the database."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(part, ast.Attribute) and part.attr == "vendor" for part in [node.left, *node.comparators])
    ]


def test_the_question_of_vendor_is_asked_in_one_place():
    """Everywhere else calls ``sql.postgresql()``: what differs on SQLite is visible in one search."""
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(("sql/", "migrations/")) or relative in OWN_VENDOR:
            continue
        lines = _vendor_branches(ast.parse(path.read_text()))
        if lines:
            offenders[relative] = lines
    assert offenders == {}, f"vendor branches outside pgbus_workflows/sql: {offenders}"
    planted = ast.parse('if connection.vendor == "postgresql":\n    pass\n')
    assert _vendor_branches(planted) == [1]  # the check sees what it looks for


def test_no_field_of_the_app_is_auto_now():
    """The batched inserts read attributes as they are (``bulk._insert_columns``): no ``pre_save`` changes them."""
    for model in apps.get_app_config("pgbus_workflows").get_models():
        for field in model._meta.concrete_fields:
            assert not getattr(field, "auto_now", False) and not getattr(field, "auto_now_add", False), field


def test_a_batch_of_many_rows_takes_an_array_per_column_and_of_few_a_parameter_per_value():
    runs = [WorkflowRun(workflow_class="x", arguments={"n": n}) for n in range(bulk.FEW_ROWS + 1)]
    many_text, many_params = bulk.insert_statement(runs)
    few_text, few_params = bulk.insert_statement(runs[:2])
    columns = len([f for f in WorkflowRun._meta.concrete_fields if not f.primary_key])
    arrays = [p for p in many_params if isinstance(p, list)]
    assert "unnest(" in many_text and many_text.count("[]") == len(arrays)
    assert all(len(values) == bulk.FEW_ROWS + 1 for values in arrays)
    assert "x" in many_params  # the class every row shares is sent once, not as an array
    assert len(arrays) < columns
    assert "unnest(" not in few_text and len(few_params) == 2 * columns


@pytest.mark.django_db(transaction=True)
def test_rows_written_with_shared_values_read_back_as_written():
    runs = [WorkflowRun(workflow_class="shared", arguments={"n": n}, current_step="a") for n in range(20)]
    batch = bulk.WriteBatch()
    batch.inserts = runs
    with transaction.atomic():
        batch.send("unused_channel")
    stored = WorkflowRun.objects.filter(workflow_class="shared").order_by("pk")
    assert [(r.workflow_id, r.arguments, r.current_step) for r in stored] == [
        (r.workflow_id, {"n": n}, "a") for n, r in enumerate(runs)
    ]
    assert [r.pk for r in runs] == [r.pk for r in stored]


WITHOUT_FLUSH = "set_config('synchronous_commit', 'off', true)"


def a_claim(text):
    """Whether ``text`` is the claim statement (whatever names earlier tests taught this process to leave out)."""
    return text.startswith(sql.statement("claim_steps", False, 0, True).split(" WHERE")[0])


@pytest.mark.django_db(transaction=True)
def test_a_claim_of_its_own_is_one_statement_committed_without_waiting_for_the_disk():
    wf = Counted.start()
    with statements_sent() as seen:
        (claimed,) = claim_due_steps(10)

    # One statement in autocommit, its planner setting before it in the same pipeline: one
    # transaction, one round trip, no BEGIN or COMMIT.
    assert len(seen) == 2 and seen[0] == sql.statement("index_order_scans"), seen
    assert a_claim(seen[1]) and WITHOUT_FLUSH in seen[1]
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with psycopg.connect(**_direct(), autocommit=True) as other:  # committed: another session sees it
        row = other.execute(f"SELECT status FROM {WorkflowStep._meta.db_table} WHERE id = %s", [claimed.pk])
        assert row.fetchone() == ("in_progress",)
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"  # set for the claim's transaction only
    assert claimed.run_id == wf.record.pk
    execute_step(claimed)


def _direct():
    s = connection.settings_dict
    return {"host": s["HOST"] or "127.0.0.1", "port": s["PORT"] or 5432, "user": s["USER"], "dbname": s["NAME"]}


def test_a_claim_inside_the_callers_transaction_leaves_its_commit_alone():
    Counted.start()
    with transaction.atomic():
        with statements_sent() as seen:
            (claimed,) = claim_due_steps(10)
        assert len(seen) == 1 and a_claim(seen[0]) and WITHOUT_FLUSH not in seen[0]
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"
    execute_step(claimed)


@pytest.mark.django_db(transaction=True)
def test_a_claim_inside_the_callers_transaction_rolls_back_with_it():
    wf = Counted.start()
    step = WorkflowStep.objects.get(run_id=wf.record.pk, status="scheduled")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert [s.pk for s in claim_due_steps(10)] == [step.pk]
        raise RuntimeError("the caller's transaction rolls back")
    assert WorkflowStep.objects.get(pk=step.pk).status == "scheduled"  # the claim went with it
    assert not WorkflowEvent.objects.filter(run_id=wf.record.pk, kind="step_started").exists()


@pytest.mark.django_db(transaction=True)
def test_the_engines_cursors_read_timestamps_with_psycopgs_own_loader_as_django_would():
    """Django's loader is psycopg's pure-Python one plus a zone set again (15 times the CPU):
    the engine's cursors read the same aware datetimes with psycopg's compiled one."""
    oid = psycopg.postgres.types["timestamptz"].oid
    with sql.bound_cursor() as bound:
        loader = bound.adapters.get_loader(oid, psycopg.pq.Format.TEXT)
    assert loader is psycopg.adapters.get_loader(oid, psycopg.pq.Format.TEXT)
    assert loader is not connection.connection.adapters.get_loader(oid, psycopg.pq.Format.TEXT)

    Counted.start()
    (claimed,) = claim_due_steps(1, claimed_by="d")  # read by the engine's claim statement
    stored = WorkflowStep.objects.get(pk=claimed.pk)  # read by Django's loader
    for name in ("scheduled_at", "started_at", "stall_at", "created_at"):
        ours, djangos = getattr(claimed, name), getattr(stored, name)
        assert (ours, ours.tzinfo) == (djangos, djangos.tzinfo), name
    assert (claimed.run.status_changed_at, claimed.run.created_at) == (
        stored.run.status_changed_at,
        stored.run.created_at,
    )


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_outcomes_is_four_round_trips_its_transactions_id_and_holds_asked_with_its_locks():
    """The id a lost COMMIT is checked by (``commit_once``) and the holds chains obey cost no round trip."""
    for _ in range(3):
        Counted.start()
    performed = [perform_step(step, verify=False) for step in claim_due_steps(3, claimed_by="d")]
    with round_trips() as trips:
        apply_outcomes(performed, Chain("d"))
    # BEGIN (psycopg syncs it apart in a pipeline); the locks, the id and the holds in force
    # (the chains obey them: services.ledger); the writes and the next steps' claim; the COMMIT.
    assert trips() == 4
    assert WorkflowStep.objects.filter(status="completed").count() == 3
    assert WorkflowStep.objects.filter(status="in_progress", claimed_by="d").count() == 3  # chained


@pytest.mark.django_db(transaction=True)
def test_a_transaction_id_is_asked_with_the_first_pipeline_or_before_the_commit_when_none_ran():
    """``commit_once`` needs the id before its COMMIT either way (a lost COMMIT is checked by it)."""
    Counted.start()
    with statements_sent() as sent:
        commit_once(lambda: WorkflowRun.objects.count())  # the ORM only: no pipeline takes the question
    assert "pg_current_xact_id" in sent[-1]  # asked after the work, before the COMMIT

    (step,) = claim_due_steps(1, claimed_by="d")
    performed = perform_step(step, verify=False)
    with statements_sent() as sent:
        apply_outcomes([performed], Chain("d"))
    asked = next(n for n, text in enumerate(sent) if "pg_current_xact_id" in text)
    assert "FOR UPDATE" in sent[asked + 1]  # queued just before the locks, in their round trip
