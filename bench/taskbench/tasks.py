"""The benchmark's tasks: an empty one, and a probe that returns when its body began."""

import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@task
def empty() -> None:
    """Nothing: what the backend costs alone."""


@task
def probe() -> float:
    """The time its body began (``time.time()``)."""
    return time.time()
