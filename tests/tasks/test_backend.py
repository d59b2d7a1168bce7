"""``pgbus_workflows.tasks.WorkflowsBackend`` through Django's public task API only.

Tasks are enqueued with ``.enqueue()`` and run by ``run_workflow_dispatcher --once`` (in this
process, through ``call_command``), then read with ``get_result``/``refresh``.
"""

from datetime import timedelta
from io import StringIO

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.db import connection, transaction
from django.test import TransactionTestCase, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.tasks.api import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.exposition import samples, value
from tests.procs import eventually
from tests.testapp import tasks
from tests.testapp.models import SideEffect
from tests.testapp.workflows import NoOp3

pytestmark = pytest.mark.django_db(transaction=True)

SIGNALS = {"enqueued": task_enqueued, "started": task_started, "finished": task_finished}


def drain(*args):
    """Run what is due once, as ``manage.py run_workflow_dispatcher --once`` does."""
    call_command("run_workflow_dispatcher", "--once", "--no-schedules", *args)


def test_an_enqueued_task_is_ready_then_runs_once_and_keeps_its_return_value():
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([2, 3], {}, "default")
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY

    drain()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and len(result.worker_ids) == 1 and result.worker_ids[0]
    assert result.enqueued_at <= result.started_at == result.last_attempted_at <= result.finished_at
    assert result.errors == []


def test_a_task_enqueued_in_a_rolled_back_transaction_does_not_exist():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.noted.enqueue("rolled back")
        raise RuntimeError("the request failed")

    with pytest.raises(TaskResultDoesNotExist):
        tasks.noted.get_result(result.id)
    drain()
    assert not SideEffect.objects.filter(label="noted").exists()


@pytest.mark.parametrize("given", ["not-an-id", "00000000-0000-0000-0000-000000000000", "run"])
def test_an_id_this_backend_never_gave_does_not_exist(given):
    if given == "run":
        given = str(NoOp3.start().workflow_id)  # a workflow run is not a task
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(given)


def test_a_failing_task_is_failed_with_its_error_and_traceback():
    result = tasks.fails.enqueue("boom")
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback and "raise ValueError(message)" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018 - the API raises here


def test_the_retrying_backend_attempts_a_failing_task_again_after_its_backoff():
    result = tasks.flaky.using(backend="retrying").enqueue("k")

    def recovered():
        drain()
        result.refresh()
        return result.is_finished

    eventually(recovered, what="the second attempt")
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, "recovered", 2)
    [error] = result.errors
    assert error.exception_class is ConnectionError


def test_a_task_that_takes_its_context_is_called_with_its_attempt():
    result = tasks.attempt_number.enqueue(extra=7)
    drain()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "extra": 7}


def test_an_async_task_runs():
    result = tasks.async_add.enqueue(20, 22)
    drain()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_a_deferred_task_waits_for_its_run_after():
    later = timezone.now() + timedelta(hours=1)
    result = tasks.noted.using(run_after=later).enqueue("deferred")
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.task.run_after == later
    assert not SideEffect.objects.filter(label="noted").exists()


def test_higher_priority_tasks_run_first():
    low = [tasks.noted.using(priority=-10).enqueue(f"low-{n}") for n in range(3)]
    high = [tasks.noted.using(priority=50).enqueue(f"high-{n}") for n in range(3)]
    drain("--concurrency", "1")
    order = list(SideEffect.objects.filter(label="noted").order_by("id").values_list("key", flat=True))
    assert order == [f"high-{n}" for n in range(3)] + [f"low-{n}" for n in range(3)]
    for result in low + high:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL


def test_a_dispatcher_serving_one_queue_runs_only_that_queue_s_tasks():
    receipt = tasks.send_receipt.enqueue(12)
    other = tasks.add.enqueue(1, 1)
    drain("--queue", "emails")
    receipt.refresh()
    other.refresh()
    assert (receipt.status, receipt.return_value) == (TaskResultStatus.SUCCESSFUL, {"sent": 12})
    assert other.status == TaskResultStatus.READY


def test_a_queue_the_backend_does_not_serve_is_refused():
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid for backend"):
        tasks.add.using(queue_name="nowhere")


@pytest.mark.parametrize("bad", [{1, 2}, object(), b"\xff"])
def test_arguments_that_are_not_json_are_refused_at_enqueue_and_nothing_is_written(bad):
    with pytest.raises((TypeError, ValueError)):
        tasks.noted.enqueue(bad)
    assert not WorkflowRun.objects.exists()


def test_a_return_value_that_is_not_json_fails_the_task():
    result = tasks.returns_a_set.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ATTEMPTS": 0}, "OPTIONS['ATTEMPTS'] must be an integer >= 1, got 0"),
        ({"BACKOFF": "soon"}, "OPTIONS['BACKOFF'] must be seconds, a timedelta or backoff"),
        ({"RETRIES": 3}, "OPTIONS has unknown keys ['RETRIES']"),
    ],
)
def test_bad_options_fail_the_backend_s_check_and_its_enqueue(options, message):
    backend = {"BACKEND": "pgbus_workflows.tasks.WorkflowsBackend", "OPTIONS": options}
    with override_settings(TASKS={"default": backend}):
        [error] = list(task_backends["default"].check())
        assert error.id == "pgbus_workflows.E013"
        assert message in error.msg
        assert "pgbus_workflows.E013" in [found.id for found in django_checks.run_checks()], "manage.py check says so"
        from pgbus_workflows.exceptions import ConfigurationError

        with pytest.raises(ConfigurationError, match="OPTIONS"):
            task_backends["default"].enqueue(tasks.add, (1, 2), {})


class AsyncAPITests(TransactionTestCase):
    async def test_aenqueue_and_aget_result_from_async_code(self):
        result = await tasks.add.aenqueue(4, 5)
        fetched = await tasks.add.aget_result(result.id)
        assert (fetched.id, fetched.status, fetched.args) == (result.id, TaskResultStatus.READY, [4, 5])


def test_tasks_are_runs_in_the_admin_and_the_cli(admin_client):
    failed = tasks.fails.enqueue("boom")
    done = tasks.add.enqueue(1, 2)
    drain()

    listed = StringIO()
    call_command("workflows", "list", "--class", "django_task.default", "--ids", stdout=listed)
    assert sorted(listed.getvalue().split()) == sorted([failed.id, done.id])
    shown = StringIO()
    call_command("workflows", "show", failed.id, stdout=shown)
    assert "ValueError" in shown.getvalue() and "boom" in shown.getvalue()

    changelist = reverse("admin:pgbus_workflows_workflowrun_changelist")
    page = admin_client.get(changelist, {"workflow_class": "django_task.default"}).content.decode()
    assert failed.id in page and done.id in page

    waiting = tasks.noted.enqueue("later")
    tasks_page = admin_client.get(reverse("admin:pgbus_workflows_djangotask_changelist"))
    assert tasks_page.status_code == 200
    rows = {row.split("</tr>")[0] for row in tasks_page.content.decode().split("<tr")[2:]}
    by_id = {result.id: next(row for row in rows if result.id in row) for result in (failed, done, waiting)}
    assert "SUCCESSFUL" in by_id[done.id] and "tests.testapp.tasks.add" in by_id[done.id]
    assert "FAILED" in by_id[failed.id] and ">ValueError<" in by_id[failed.id]
    assert "READY" in by_id[waiting.id] and ">0<" in by_id[waiting.id]
    run_page = reverse(
        "admin:pgbus_workflows_workflowrun_change", args=[WorkflowRun.objects.get(workflow_id=done.id).pk]
    )
    assert run_page in by_id[done.id]
    found = admin_client.get(reverse("admin:pgbus_workflows_djangotask_changelist"), {"q": failed.id[:8]})
    assert failed.id in found.content.decode() and done.id not in found.content.decode()


def test_a_task_cancelled_before_it_ran_never_runs_and_is_failed():
    result = tasks.noted.enqueue("cancelled")
    call_command("workflows", "cancel", result.id, "--reason", "not needed", stdout=StringIO())
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert not SideEffect.objects.filter(label="noted").exists()


def test_the_api_s_signals_are_sent_at_enqueue_start_and_finish():
    seen = []

    def note(signal_name):
        def receiver(sender, task_result, **kwargs):
            value = task_result.return_value if task_result.status == TaskResultStatus.SUCCESSFUL else None
            seen.append((signal_name, task_result.id, task_result.status, value))

        return receiver

    receivers = [(signal, note(name)) for name, signal in SIGNALS.items()]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:
        result = tasks.add.enqueue(2, 2)
        drain()
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    assert seen == [
        ("enqueued", result.id, TaskResultStatus.READY, None),
        ("started", result.id, TaskResultStatus.RUNNING, None),
        ("finished", result.id, TaskResultStatus.SUCCESSFUL, 4),
    ]


def test_the_tasks_list_costs_the_same_queries_for_three_tasks_or_thirty(admin_client):
    url = reverse("admin:pgbus_workflows_djangotask_changelist")

    def queries_for(count):
        for n in range(count):
            tasks.noted.enqueue(n)
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200
        return len(captured)

    assert queries_for(3) == queries_for(27)


def test_a_rerun_task_is_a_new_task_with_the_same_arguments():
    failed = tasks.fails.enqueue("boom")
    drain()
    printed = StringIO()
    call_command("workflows", "rerun", failed.id, "--json", "--reason", "try again", stdout=printed)
    [again] = WorkflowRun.objects.exclude(workflow_id=failed.id)
    rerun = task_backends["default"].get_result(str(again.workflow_id))
    assert (rerun.task.func, rerun.args, rerun.status) == (tasks.fails.func, ["boom"], TaskResultStatus.READY)


def test_whoever_may_view_runs_may_view_tasks(client):
    from django.contrib.auth.models import Permission, User

    viewer = User.objects.create_user("viewer", is_staff=True)
    url = reverse("admin:pgbus_workflows_djangotask_changelist")
    client.force_login(viewer)
    assert client.get(url).status_code == 403
    viewer.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    assert client.get(url).status_code == 200


@override_settings(ROOT_URLCONF="tests.metrics_urls")
def test_tasks_are_counted_in_the_metrics_as_runs_of_their_class(client):
    tasks.add.enqueue(1, 1)
    tasks.add.enqueue(2, 2)
    table = samples(client.get("/metrics/").content.decode())
    assert value(table, "pgbus_workflows_runs", workflow_class="django_task.default", status="ready") == 2


def test_retention_deletes_a_finished_task_as_it_deletes_a_run():
    result = tasks.add.enqueue(3, 4)
    drain()
    with override_settings(PGBUS_WORKFLOWS={"RETENTION": 0.05}):
        eventually(lambda: not drain() and not WorkflowRun.objects.exists(), what="the sweep's retention")
    with pytest.raises(TaskResultDoesNotExist):
        result.refresh()


def test_the_tasks_list_filters_by_the_state_get_result_gives(admin_client):
    from pgbus_workflows.services.claims import claim_due_steps

    failed = tasks.fails.enqueue("boom")
    done = tasks.add.enqueue(1, 2)
    drain()
    running = tasks.noted.enqueue("claimed")
    assert len(claim_due_steps(1, claimed_by="test")) == 1
    ready = tasks.noted.enqueue("waiting")
    url = reverse("admin:pgbus_workflows_djangotask_changelist")
    everything = (failed, done, running, ready)
    for state, expected in (("FAILED", failed), ("SUCCESSFUL", done), ("RUNNING", running), ("READY", ready)):
        assert task_backends["default"].get_result(expected.id).status == state
        page = admin_client.get(url, {"state": state}).content.decode()
        assert [result.id in page for result in everything] == [result is expected for result in everything], state
    assert "?state=FAILED" in admin_client.get(url).content.decode()
