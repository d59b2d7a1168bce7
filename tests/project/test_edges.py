"""The edges refuse what the database cannot store, at definition time or with a clear error."""

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings

from pgbus_workflows import Workflow, step
from pgbus_workflows.checks import check_settings
from pgbus_workflows.exceptions import ConfigurationError, PayloadNotSerializable
from pgbus_workflows.models import WorkflowRun
from tests.testapp.workflows import Approval, Counted

pytestmark = pytest.mark.django_db

DEEP = []
for _ in range(100_000):
    DEEP = [DEEP]


def test_arguments_nested_too_deeply_are_refused_before_any_write():
    with pytest.raises(PayloadNotSerializable, match="nested too deeply"):
        Counted.start(tree=DEEP)
    assert not WorkflowRun.objects.exists()


def test_a_queue_name_longer_than_the_column_is_refused_when_the_class_is_defined():
    with pytest.raises(ConfigurationError, match="at most 255 characters"):

        class LongQueue(Workflow):
            name = "edges_long_queue"

            @step(queue="q" * 256)
            def only(self):
                pass

    with pytest.raises(ConfigurationError, match="at most 255 characters"):

        class LongDefaultQueue(Workflow):
            name = "edges_long_default_queue"
            step_options = {"queue": "q" * 256}

            @step
            def only(self):
                pass


@pytest.mark.parametrize(("key", "limit"), [("NOTIFY_CHANNEL", 63), ("DEFAULT_QUEUE", 255)])
def test_names_postgresql_would_truncate_fail_the_system_check(key, limit):
    with override_settings(PGBUS_WORKFLOWS={key: "c" * (limit + 1)}):
        (error,) = check_settings()
    assert error.id == "pgbus_workflows.E010" and f"at most {limit} bytes" in error.msg
    with override_settings(PGBUS_WORKFLOWS={key: "c" * limit}):
        assert check_settings() == []


def test_find_returns_none_for_a_malformed_id_but_never_hides_a_database_error():
    assert Workflow.find("not-a-uuid") is None
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        wf = Counted.start()
        assert Workflow.find(wf.workflow_id).workflow_id == wf.workflow_id
    with pytest.raises(DatabaseError), transaction.atomic():
        with connection.cursor() as cursor:
            try:
                cursor.execute("SELECT 1 / 0")
            except DatabaseError:
                pass  # the transaction is now aborted: the next query fails, and find says so
        Workflow.find(wf.workflow_id)


@pytest.fixture
def server_side_binding():
    """This thread's connection with psycopg's server-side binding, as a project may configure it."""
    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["server_side_binding"] = True
    yield
    connection.close()
    options.pop("server_side_binding")


@pytest.mark.django_db(transaction=True)
def test_runs_start_and_run_with_server_side_binding(server_side_binding):
    from pgbus_workflows.services.executor import run_due_steps

    wf = Approval.start()
    wf.signal("approved", {"n": 1})
    while run_due_steps(claimed_by="test"):
        pass

    assert wf.reload().status == "finished"
    assert connection.connection.cursor_factory.__name__ != "ClientCursor"


def test_a_step_name_or_signal_name_longer_than_the_columns_is_refused_when_the_class_is_defined():
    long = "s" * 256
    with pytest.raises(ConfigurationError, match="step name must be at most 255"):
        type("LongStep", (Workflow,), {"name": "edges_long_step", long: step(lambda self: None)})
    with pytest.raises(ConfigurationError, match="wait_for names must be at most 255"):

        class LongSignal(Workflow):
            name = "edges_long_signal"

            @step(wait_for=long)
            def wait(self):
                pass


def test_the_sweep_lock_is_free_as_soon_as_it_is_released():
    from pgbus_workflows.sql.session import TransactionLock

    first, second = TransactionLock(0x7067627574), TransactionLock(0x7067627574)
    for _ in range(50):
        assert first.acquire()
        assert not second.acquire()  # held
        first.release()
        assert second.acquire(), "the lock was still held right after its release"
        second.release()
