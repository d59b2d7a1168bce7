"""``start()``'s server-side function: installed by ``migrate``, called from a connection's Nth start.

Where the engine may not prepare (a web process), the server would parse and plan ``start()``'s
statement on every call; the same statement as a PL/pgSQL function is planned once per
server session (``sql.functions``). These tests hold the function to the statement's rows,
refusals and ``NOTIFY``, and the switch to the round trips it promises.
"""

from contextlib import contextmanager

import psycopg
import pytest
from django.db import ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext

from pgbus_workflows import AlreadyRunning, Workflow, sql, step
from pgbus_workflows.conf import settings
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep
from pgbus_workflows.sql import functions
from pgbus_workflows.sql.session import connection_params
from tests.testapp.models import Order


class FunctionStart(Workflow):
    name = "function_start"

    @step(queue="function_queue", priority=3)
    def first(self):
        return None

    @step
    def second(self):
        return None


@pytest.fixture(autouse=True)
def unprepared(monkeypatch):
    """Connections as a web process's: not allowed to prepare (another test may have allowed this one),
    and as if new to start() (another test's starts may have found the function a test here drops)."""
    monkeypatch.setattr(sql, "_prepared_at", set())
    if connection.connection is not None:
        sql._preparing.pop(connection.connection, None)
        functions.forget(connection.connection)


def _fresh_connection():
    """The next query opens a new connection: it has made no start yet."""
    connection.close()
    connection.ensure_connection()


def _starts(count, **kwargs):
    """``count`` starts (each with a new subject), and the one statement each sent."""
    texts = []
    handles = []
    for _ in range(count):
        order = Order.objects.create()
        with CaptureQueriesContext(connection) as queries:
            handles.append(FunctionStart.start(order, **kwargs))
        sent = _sent(queries)
        assert len(sent) == 1, sent
        texts.append(sent[0])
    return handles, texts


def _sent(queries):
    """What a capture saw but the engine's clock, read again now and then (``clock.REANCHOR_EVERY``)."""
    return [q["sql"] for q in queries.captured_queries if q["sql"] != "SELECT clock_timestamp()"]


def _how(text):
    if text.startswith(f"SELECT * FROM public.{functions.PREFIX}"):  # schema-qualified: the runs table's schema
        return "call"
    assert text.startswith("WITH r AS"), text
    return "probe" if "to_regproc" in text else "statement"


@pytest.mark.django_db(transaction=True)
def test_migrate_installs_the_function_this_code_calls():
    """The test database was made by ``migrate``: its post_migrate made the function of these models."""
    name = functions.function_name(connection)
    assert functions.installed_name() == f"public.{name}"  # in the runs table's schema
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.lanname, pg_get_function_result(p.oid) FROM pg_proc p "
            "JOIN pg_language l ON l.oid = p.prolang WHERE p.proname = %s",
            [name],
        )
        rows = cursor.fetchall()
    assert rows == [("plpgsql", "TABLE(new_run bigint, new_step bigint)")]
    assert functions.install() is False  # there already: nothing to do


@pytest.mark.django_db(transaction=True)
def test_a_connection_calls_the_function_from_its_nth_start_in_one_statement_each():
    """Statements before the threshold; the Nth asks whether the function exists; then calls: one statement each."""
    _fresh_connection()
    _, texts = _starts(functions.THRESHOLD + 3)
    hows = [_how(text) for text in texts]
    expected = ["statement"] * (functions.THRESHOLD - 1) + ["probe"] + ["call"] * 3
    assert hows == expected
    assert WorkflowRun.objects.filter(workflow_class=FunctionStart.name).count() == functions.THRESHOLD + 3


@pytest.mark.django_db(transaction=True)
def test_the_function_writes_the_rows_the_statement_writes():
    _fresh_connection()
    (by_statement, *_, by_call), texts = _starts(functions.THRESHOLD + 1, arguments={"plan": "pro", "n": [1, 2]})
    assert (_how(texts[0]), _how(texts[-1])) == ("statement", "call")

    def rows_of(wf):
        run = WorkflowRun.objects.filter(pk=wf.record.pk).values().get()
        step_row = WorkflowStep.objects.filter(run_id=wf.record.pk).values().get()
        event = WorkflowEvent.objects.filter(run_id=wf.record.pk).values().get()
        varying = {"id", "run_id", "workflow_id", "subject_id", "created_at", "started_at", "status_changed_at"}
        varying |= {"scheduled_at", "trace_context"}
        return [{k: v for k, v in row.items() if k not in varying} for row in (run, step_row, event)]

    assert rows_of(by_call) == rows_of(by_statement)
    step_row = WorkflowStep.objects.get(run_id=by_call.record.pk)
    written = (step_row.step_name, step_row.queue, step_row.priority, step_row.status)
    assert written == ("first", "function_queue", 3, "scheduled")
    assert by_call.record.pk == step_row.run_id and by_call.record.status == "ready"


@pytest.mark.django_db(transaction=True)
def test_the_function_refuses_what_the_statement_refuses_and_leaves_the_transaction_usable():
    _fresh_connection()
    _starts(functions.THRESHOLD)  # the next start calls the function
    order = Order.objects.create()
    first = FunctionStart.start(order, idempotency_key="same-key")
    again = FunctionStart.start(order, idempotency_key="same-key")
    assert again.duplicate_start and again.workflow_id == first.workflow_id
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            with pytest.raises(AlreadyRunning):
                FunctionStart.start(order)
        assert _how(_sent(queries)[0]) == "call"
        assert not any("SAVEPOINT" in q["sql"] for q in queries.captured_queries)
        assert WorkflowRun.objects.filter(subject_id=str(order.pk)).count() == 1  # the transaction still works


@contextmanager
def _calling_and_listening():
    """A new connection whose next start calls the function, and another that LISTENs on the dispatchers' channel."""
    _fresh_connection()
    _starts(functions.THRESHOLD)
    with psycopg.connect(**connection_params(), autocommit=True) as listener:
        listener.execute(f'LISTEN "{settings.NOTIFY_CHANNEL}"')
        yield listener


@pytest.mark.django_db(transaction=True)
def test_the_function_notifies_only_when_it_wrote_a_run():
    with _calling_and_listening() as listener:
        order = Order.objects.create()
        FunctionStart.start(order)
        with pytest.raises(AlreadyRunning):
            FunctionStart.start(order)  # refused: no NOTIFY
        FunctionStart.start(Order.objects.create())
        payloads = [note.payload for note in listener.notifies(timeout=1.0, stop_after=3)]
    assert payloads == ["function_queue", "function_queue"]


@pytest.mark.django_db(transaction=True)
def test_a_start_inside_a_rolled_back_transaction_leaves_nothing_and_notifies_nothing():
    with _calling_and_listening() as listener:
        with transaction.atomic():
            wf = FunctionStart.start(Order.objects.create())
            transaction.set_rollback(True)
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
    assert not WorkflowRun.objects.filter(pk=wf.record.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_function_dropped_under_a_connection_costs_one_start_in_a_transaction_and_none_outside():
    name = functions.function_name(connection)
    _fresh_connection()
    _starts(functions.THRESHOLD)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP FUNCTION {functions.installed_name()}")
        order = Order.objects.create()
        with CaptureQueriesContext(connection) as queries:
            wf = FunctionStart.start(order)  # outside a transaction: the call fails, the statement runs instead
        assert [_how(text) for text in _sent(queries)] == ["call", "statement"]
        assert WorkflowRun.objects.get(pk=wf.record.pk).subject_id == str(order.pk)
        assert functions.installed_name() is None
        _, texts = _starts(1)
        assert _how(texts[0]) == "statement"

        _fresh_connection()
        _starts(functions.THRESHOLD)  # this one asked and found none: statements
        functions.install()
        assert functions.installed_name() == f"public.{name}"
        functions.found(connection.connection, f"public.{name}")  # as its next probe would say
        with connection.cursor() as cursor:
            cursor.execute(f"DROP FUNCTION {name}")
        with pytest.raises(ProgrammingError, match="does not exist"):
            with transaction.atomic():
                FunctionStart.start(Order.objects.create())
        _, texts = _starts(1)
        assert _how(texts[0]) == "statement"
    finally:
        functions.install()
    assert functions.installed_name() == f"public.{name}"


@pytest.mark.django_db
def test_migrating_the_tables_away_drops_every_start_function():
    """``migrate pgbus_workflows zero`` then post_migrate: no table, so no function may stay (in this transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE FUNCTION {functions.PREFIX}0000(a int) RETURNS int LANGUAGE sql AS 'SELECT a'")
        cursor.execute(f'ALTER TABLE "{WorkflowRun._meta.db_table}" RENAME TO pgbus_wf_run_moved_away')
        assert functions.install() is False
        cursor.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE %s", [functions.PREFIX + "%"])
        assert cursor.fetchone()[0] == 0
        assert functions.installed_name() is None
    # The test's transaction rolls back: the table and the function are back.


@pytest.mark.django_db
def test_a_connection_that_prepares_runs_the_prepared_statement():
    """A dispatcher's connection prepares the statement: better than the function, so it never calls it."""
    _starts(1)
    raw = connection.connection
    saved = raw.prepare_threshold
    sql._preparing[raw] = True
    try:
        _, texts = _starts(functions.THRESHOLD + 2)
    finally:
        sql._preparing.pop(raw, None)
        raw.prepare_threshold = saved
        connection.close()  # what it prepared stays with that connection
    assert {_how(text) for text in texts} == {"statement"}


@pytest.mark.django_db
def test_a_database_that_refuses_the_function_logs_it_and_start_runs_its_statement(caplog):
    """A role that may not create functions: migrate goes on, the warning says so, start() still works."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION {functions.installed_name()}")
        cursor.execute("CREATE ROLE pgbus_wf_no_create NOLOGIN")
        cursor.execute("GRANT USAGE ON SCHEMA public TO pgbus_wf_no_create")
        cursor.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        cursor.execute("SET ROLE pgbus_wf_no_create")
        try:
            assert functions.install() is False
        finally:
            cursor.execute("RESET ROLE")
    assert "Could not create start()'s function" in caplog.text
    assert "permission denied" in caplog.text
    assert functions.installed_name() is None
    wf = FunctionStart.start(Order.objects.create())
    assert WorkflowRun.objects.filter(pk=wf.record.pk).exists()
    # The test's transaction rolls back: the role, the grants and the function are as they were.


@pytest.mark.django_db
def test_a_role_that_may_not_call_the_function_never_calls_it():
    """A hardened database revokes EXECUTE from PUBLIC: the probe asks for the privilege, not only the name."""
    name = functions.installed_name()
    with connection.cursor() as cursor:
        cursor.execute("CREATE ROLE pgbus_wf_web NOLOGIN")
        cursor.execute("GRANT USAGE ON SCHEMA public TO pgbus_wf_web")
        cursor.execute("GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO pgbus_wf_web")
        cursor.execute("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO pgbus_wf_web")
        cursor.execute(f"REVOKE EXECUTE ON FUNCTION {name} FROM PUBLIC")
        cursor.execute("SET ROLE pgbus_wf_web")
    try:
        functions.forget(connection.connection)
        handles, texts = _starts(functions.THRESHOLD + 2)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
    assert [_how(text) for text in texts][-3:] == ["probe", "statement", "statement"]
    assert WorkflowRun.objects.filter(pk__in=[wf.record.pk for wf in handles]).count() == functions.THRESHOLD + 2
    # The test's transaction rolls back: the role and the grants are gone, EXECUTE is PUBLIC's again.


def test_the_name_digests_every_column_the_function_writes():
    """A migration that adds a column to a run, an attempt or an event makes a function of another name."""
    import hashlib

    definition = functions._definition(connection)
    for model in (WorkflowRun, WorkflowStep, WorkflowEvent):
        for field in model._meta.concrete_fields:
            if not field.primary_key:
                assert f'"{field.column}"' in definition, (model.__name__, field.column)
    digest = hashlib.sha256(definition.encode()).hexdigest()[:16]
    assert functions.function_name(connection) == functions.PREFIX + digest


@pytest.mark.django_db
def test_migrate_keeps_the_functions_older_code_calls():
    """A rolling deploy: code of an earlier definition still calls its own function while the new one is made."""
    older = f"{functions.PREFIX}00000000000000aa"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE FUNCTION {older}(a int) RETURNS int LANGUAGE sql AS 'SELECT a'")
        cursor.execute(f"DROP FUNCTION {functions.installed_name()}")
        assert functions.install() is True
        cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE %s ORDER BY proname", [functions.PREFIX + "%"])
        names = [name for (name,) in cursor.fetchall()]
    assert names == sorted([older, functions.function_name(connection)])


@pytest.mark.django_db(transaction=True)
def test_a_connection_that_found_no_function_asks_again_after_a_while(monkeypatch):
    name = functions.installed_name()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION {name}")
    try:
        _fresh_connection()
        _, texts = _starts(functions.THRESHOLD + 1)
        assert [_how(text) for text in texts][-2:] == ["probe", "statement"]  # none found: not asked again at once
        functions.install()
        monkeypatch.setattr(functions, "RECHECK_SECONDS", 0.0)  # as if a minute had gone by
        _, texts = _starts(2)
        assert [_how(text) for text in texts] == ["probe", "call"]
    finally:
        functions.install()
