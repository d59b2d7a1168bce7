"""The task API as Django states it: who sends the signals and what they carry, the order of
deferred tasks, and a dispatcher refused inside ``atomic()`` (the check without the app:
``test_check_processes``)."""

from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

from pgbus_workflows.tasks import WorkflowsBackend
from pgbus_workflows.tasks.api import TaskResultStatus, task_backends, task_enqueued, task_finished, task_started
from tests.procs import eventually
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

SIGNALS = {"enqueued": task_enqueued, "started": task_started, "finished": task_finished}


def drain(*args):
    """Run what is due once, as ``manage.py run_workflow_dispatcher --once`` does."""
    call_command("run_workflow_dispatcher", "--once", "--no-schedules", *args)


@contextmanager
def received_from_the_backend_class():
    """``(signal name, TaskResult)`` of each signal a receiver connected with ``sender=WorkflowsBackend`` gets."""
    seen = []

    def note(name):
        def receiver(sender, task_result, **kwargs):
            seen.append((name, task_result))

        return receiver

    receivers = [(signal, note(name)) for name, signal in SIGNALS.items()]
    for signal, receiver in receivers:
        signal.connect(receiver, sender=WorkflowsBackend)
    try:
        yield seen
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver, sender=WorkflowsBackend)


@pytest.mark.parametrize("task", [tasks.add, tasks.async_add])
def test_the_signals_are_sent_by_the_backend_class_with_the_return_value(task):
    with received_from_the_backend_class() as seen:
        task.enqueue(2, 3)
        drain()
    assert [(name, result.status) for name, result in seen] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    finished = seen[-1][1]
    assert (finished.return_value, finished.errors, finished.finished_at is not None) == (5, [], True)


@pytest.mark.parametrize("task", [tasks.fails, tasks.async_fails])
def test_task_finished_of_a_failed_task_carries_its_error_as_get_result_does(task):
    with received_from_the_backend_class() as seen:
        task.enqueue("boom")
        drain()
    name, finished = seen[-1]
    assert (name, finished.status) == ("finished", TaskResultStatus.FAILED)
    [error] = finished.errors
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: boom\n") and "raise ValueError(message)" in error.traceback
    stored = task_backends["default"].get_result(finished.id)
    assert [e.exception_class_path for e in stored.errors] == ["builtins.ValueError"]
    assert stored.errors[0].traceback.endswith("ValueError: boom\n")


def test_a_retried_task_s_task_finished_lists_every_attempt_s_error():
    with received_from_the_backend_class() as seen:
        tasks.fails.using(backend="retrying").enqueue("again")
        finished = []

        def three_attempts_ended():
            drain()
            finished[:] = [result for name, result in seen if name == "finished"]
            return len(finished) == 3

        eventually(three_attempts_ended, what="the three attempts of the retrying backend")
    assert [len(result.errors) for result in finished] == [1, 2, 3]


def test_tasks_of_one_priority_run_in_the_order_they_became_due():
    now = timezone.now()
    tasks.noted.enqueue("enqueued-first")
    tasks.noted.using(run_after=now - timedelta(minutes=1)).enqueue("due-a-minute-ago")
    tasks.noted.using(run_after=now - timedelta(minutes=2)).enqueue("due-two-minutes-ago")
    drain("--concurrency", "1")
    order = list(SideEffect.objects.filter(label="noted").order_by("id").values_list("key", flat=True))
    assert order == ["due-two-minutes-ago", "due-a-minute-ago", "enqueued-first"]


def test_a_dispatcher_started_inside_an_open_transaction_is_refused_and_runs_nothing():
    with transaction.atomic():
        result = tasks.noted.enqueue("not committed yet")
        with pytest.raises(CommandError, match="cannot run inside an open transaction"):
            drain()
        assert not SideEffect.objects.filter(label="noted").exists()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
