"""Task functions for the task backend's tests (Django's ``@task``; on Django 5.2, the backport's)."""

import asyncio
import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2
    from django_tasks import task

from .models import SideEffect


@task
def add(a, b):
    return a + b


@task(queue_name="emails", priority=10)
def send_receipt(order_id):
    SideEffect.objects.create(label="receipt", key=str(order_id))
    return {"sent": order_id}


@task
def noted(key, priority_note=""):
    """Records that it ran (each run once: the tests count the rows)."""
    SideEffect.objects.create(label="noted", key=str(key))
    return key


@task
def fails(message):
    raise ValueError(message)


@task
def flaky(key):
    """Fails its first run with ConnectionError, succeeds after."""
    SideEffect.objects.create(label="flaky", key=str(key))
    if SideEffect.objects.filter(label="flaky", key=str(key)).count() == 1:
        raise ConnectionError("the API answered 503")
    return "recovered"


@task(takes_context=True)
def attempt_number(context, extra=0):
    return {"attempt": context.attempt, "id": context.task_result.id, "extra": extra}


@task
async def async_add(a, b):
    await asyncio.sleep(0.01)
    return a + b


@task
def returns_a_set():
    return {1, 2}


@task
def sleeps(seconds, key=""):
    SideEffect.objects.create(label="sleeps-start", key=str(key))
    time.sleep(seconds)
    SideEffect.objects.create(label="sleeps-end", key=str(key))
    return key


@task
def hangs_first_time(key):
    """Its first run sleeps for a minute (long enough to be killed mid-task); later runs end at once."""
    SideEffect.objects.create(label="hangs-start", key=str(key))
    if SideEffect.objects.filter(label="hangs-start", key=str(key)).count() == 1:
        time.sleep(60)
    return "done"


@task
async def async_fails(message):
    await asyncio.sleep(0)
    raise ValueError(message)


@task
def for_account(account_id, note=""):
    """Records its account when it ran: the fairness tests read the order the accounts' tasks ran in."""
    SideEffect.objects.create(label="account-task", key=str(account_id))
    return account_id


def account_key(task, args, kwargs):
    """A ``FAIRNESS`` key function: ``for_account``'s account by keyword, else None (the task's own key)."""
    return f"account:{kwargs['account_id']}" if "account_id" in kwargs else None


def account_weight(key):
    """A ``FAIRNESS`` weight function: an account whose name ends with ``-x3`` weighs 3."""
    return 3 if key.endswith("-x3") else 1


not_a_function = 42
