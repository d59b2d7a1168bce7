"""Run Django's own task tests (``tests/tasks`` of its source distribution) against ``WorkflowsBackend``.

    python -m tests.upstream.run        (from the repository's root; DATABASE_URL as for the suite)

The tests are not in the repository: the source distribution of the installed Django is
fetched with ``pip download`` into a temporary folder, and they run from there with Django's
own runner (``DiscoverRunner``). The adaptation, all of it here:

1. The stand-in backends the tests name, ``django.tasks.backends.dummy.DummyBackend`` and
   ``django.tasks.backends.immediate.ImmediateBackend``, are read as ``tests.upstream.backends``'
   (``WorkflowsBackend``, storing; and ``WorkflowsBackend`` running the task in ``enqueue``).
2. Their ``SimpleTestCase`` classes may use the ``default`` database, where the tasks are.
3. The tests that check what only a stand-in does are skipped, each with its reason
   (:data:`NOT_APPLICABLE`, also in ``docs/tasks.md``).

Django 5.2 has no ``django.tasks`` and no such tests: there, this runs the ``django-tasks``
backport's and django-tasks-db's tests instead, vendored in this repository
(``tests.upstream.vendored``).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The stand-in backends' module paths in the tests, and ours (adaptation 1).
BACKEND_MODULES = {
    "django.tasks.backends.dummy": "tests.upstream.backends",
    "django.tasks.backends.immediate": "tests.upstream.backends",
}

#: Tests that check what only Django's stand-ins do, by test id: why they do not apply.
NOT_APPLICABLE: dict[str, str] = {
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result": (
        "changes the stand-in's result in its in-memory list and reads it back; tasks live in PostgreSQL"
    ),
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result_async": "as test_refresh_result",
    "tasks.test_dummy_backend.DummyBackendTransactionTestCase.test_doesnt_wait_until_transaction_commit_by_default": (
        "the stand-in keeps a task made in a transaction that has not committed; WorkflowsBackend writes it "
        "in that transaction, on purpose (a rolled-back request enqueues nothing)"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTransactionTestCase.test_doesnt_wait_until_transaction_commit_by_default": (  # noqa: E501
        "as the dummy backend's test of that name"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result": (
        "the immediate backend keeps no results; WorkflowsBackend supports get_result"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result": "as test_cannot_get_result",
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after": (
        "the immediate backend cannot defer; WorkflowsBackend supports run_after"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt": (
        "the immediate backend runs the task in the caller, whose Ctrl-C ends enqueue(); a dispatcher records "
        "a task that raises KeyboardInterrupt as failed, and stops on its own SIGINT"
    ),
    "tasks.test_tasks.TaskTestCase.test_refresh_result": (
        "calls the synchronous refresh() inside an async test: a backend that reads a database cannot be "
        "called from the event loop (Django refuses it); arefresh() is tested, and passes, in the same test's "
        "async half and in test_dummy_backend's async tests"
    ),
}


def fetch(version: str, into: Path) -> Path:
    """Django ``version``'s ``tests`` folder, from its source distribution on the package index."""
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, f"django=={version}", "--dest", str(into)], check=True)
    [archive] = into.glob("django-*.tar.gz")
    prefix = f"{archive.name.removesuffix('.tar.gz')}/tests/tasks/"
    with tarfile.open(archive) as sdist:
        members = [member for member in sdist.getmembers() if member.name.startswith(prefix)]
        if not members:
            raise SystemExit(f"{archive.name} has no {prefix}: Django moved its task tests")
        sdist.extractall(into, members=members, filter="data")
    return into / prefix.removesuffix("tasks/")


def adapt(tests: Path) -> None:
    """Point the tests' stand-in backends at ours (adaptation 1)."""
    for path in sorted((tests / "tasks").glob("*.py")):
        text = path.read_text()
        for theirs, ours in BACKEND_MODULES.items():
            text = text.replace(theirs, ours)
        path.write_text(text)


def skip_not_applicable() -> None:
    """Skip each test of :data:`NOT_APPLICABLE`, with its reason (adaptation 3)."""
    for test_id, reason in NOT_APPLICABLE.items():
        module_name, class_name, method_name = test_id.rsplit(".", 2)
        cls = getattr(importlib.import_module(module_name), class_name)
        if not hasattr(cls, method_name):
            raise SystemExit(f"{test_id} is no longer in Django's tests: update NOT_APPLICABLE")
        setattr(cls, method_name, unittest.skip(f"not applicable: {reason}")(getattr(cls, method_name)))


def main() -> int:
    """Fetch, adapt and run the tests; the exit status is the runner's (0: all passed or skipped)."""
    import django

    if django.VERSION < (6, 0):
        from tests.upstream import vendored

        version = django.get_version()
        sys.stdout.write(f"Django {version} has no django.tasks: the backport's and django-tasks-db's tests run\n")
        return vendored.main([])
    with tempfile.TemporaryDirectory(prefix="django-task-tests-") as folder:
        tests = fetch(django.get_version(), Path(folder))
        adapt(tests)
        sys.path[:0] = [str(tests), str(ROOT)]
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.upstream.settings"
        django.setup()
        from django.test import SimpleTestCase
        from django.test.runner import DiscoverRunner

        SimpleTestCase.databases = {"default"}  # adaptation 2
        skip_not_applicable()
        runner = DiscoverRunner(top_level=str(tests), verbosity=int(os.environ.get("VERBOSITY", "1")))
        failures = runner.run_tests(["tasks"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
