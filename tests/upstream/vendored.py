"""Run the django-tasks backport's and django-tasks-db's own tests against ``WorkflowsBackend`` (Django 5.2).

    python -m tests.upstream.vendored             (both suites, side by side, each in a process of its own)
    python -m tests.upstream.vendored backport    (one suite, in this process: backport or tasks_db)

Neither project publishes its tests in its wheel, so their test files are kept, unmodified, in
``tests/upstream/vendor/`` with their licence and the commit they come from (``README.md``
there). Both name their test package ``tests``, as this repository does: a suite runs in a
process where ``tests`` is its own package (its folder first on ``sys.path``, ours forgotten
once the settings and our backends are loaded). django-tasks-db's tests import its package,
which is fetched at run time (``pip download``, the version its tests were taken from) rather
than installed. The adaptation, all of it here:

1. The backport's stand-in backends, ``django_tasks.backends.dummy`` and ``.immediate``, are
   ``tests.upstream.backends``' (``WorkflowsBackend``, storing; and running the task in
   ``enqueue``), as for Django's own tests (``run.py``); django-tasks-db's
   ``DatabaseBackend`` is ``WorkflowsBackend`` itself.
2. Their ``SimpleTestCase`` classes may use the ``default`` database, where the tasks are.
3. The tests, or whole test classes, that check what only the stand-ins or django-tasks-db's
   own parts do are skipped, each with its reason (:data:`SUITES`, also in ``docs/tasks.md``).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENDOR = Path(__file__).resolve().parent / "vendor"

#: The apps every suite has: Django's own that their URLs and tests touch, and this one.
BASE_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pgbus_workflows",
]


@dataclass(frozen=True)
class Suite:
    """One upstream project's tests: where they are, what they need, what does not apply and why."""

    folder: Path
    label: str
    #: The project's distribution and the version its vendored tests are of.
    distribution: str
    version: str
    apps: list[str]
    tasks: dict[str, dict[str, Any]]
    #: Test ids (``tests.tests.Class.test_name``) or class ids (``tests.tests.Class``): why they do not apply.
    not_applicable: dict[str, str]
    urls: str | None = None
    #: Whether the distribution is fetched at run time (else it is the one installed, the ``tasks`` extra).
    fetched: bool = False
    #: Adaptation 1: the modules read as ``tests.upstream.backends``, the classes read as ``WorkflowsBackend``.
    stand_in_modules: tuple[str, ...] = ()
    stand_in_classes: tuple[str, ...] = ()


STORE = "it changes the stand-in's result in its in-memory list and reads it back; tasks live in PostgreSQL"
BACKPORT = "tests.tests.test_"
TASKS_DB = "tests.tests."
MODEL_ONLY = "tests django-tasks-db's DBTaskResult model alone; no backend is called"

SUITES: dict[str, Suite] = {
    "backport": Suite(
        folder=VENDOR / "django-tasks",
        label="tests.tests",
        distribution="django-tasks",
        version="0.12.0",
        apps=[*BASE_APPS, "django_tasks"],
        urls="tests.urls",
        tasks={"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}},
        stand_in_modules=("django_tasks.backends.dummy", "django_tasks.backends.immediate"),
        not_applicable={
            f"{BACKPORT}dummy_backend.DummyBackendTestCase.test_refresh_result": STORE,
            f"{BACKPORT}dummy_backend.DummyBackendTestCase.test_refresh_result_async": "as test_refresh_result",
            f"{BACKPORT}immediate_backend.ImmediateBackendTestCase.test_cannot_get_result": (
                "the immediate backend keeps no results; WorkflowsBackend supports get_result"
            ),
            f"{BACKPORT}immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result": (
                "as test_cannot_get_result"
            ),
            f"{BACKPORT}immediate_backend.ImmediateBackendTestCase.test_get_result_from_different_request": (
                "expects the immediate backend's NotImplementedError from get_result; WorkflowsBackend supports it"
            ),
            f"{BACKPORT}immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after": (
                "the immediate backend cannot defer; WorkflowsBackend supports run_after"
            ),
            f"{BACKPORT}immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt": (
                "the immediate backend runs the task in the caller, whose Ctrl-C ends enqueue(); a dispatcher "
                "records a task that raises KeyboardInterrupt as failed, and stops on its own SIGINT"
            ),
            f"{BACKPORT}tasks.TaskTestCase.test_refresh_result": (
                "calls the synchronous refresh() inside an async test: a backend that reads a database cannot "
                "be called from the event loop (Django refuses it); arefresh() is tested, and passes"
            ),
        },
    ),
    "tasks_db": Suite(
        folder=VENDOR / "django-tasks-db",
        label="tests.tests",
        distribution="django-tasks-db",
        version="0.12.0",
        fetched=True,
        apps=[*BASE_APPS, "django_tasks_db"],
        tasks={"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "queue-1"]}},
        stand_in_classes=("django_tasks_db.DatabaseBackend",),
        not_applicable={
            **{
                f"{TASKS_DB}DatabaseBackendTestCase.{name}": MODEL_ONLY
                for name in (
                    "test_invalid_task_path",
                    "test_missing_task_path",
                    "test_task_name",
                    "test_priority_range_check",
                )
            },
            f"{TASKS_DB}DatabaseBackendTestCase.test_refresh_result": (
                "changes django-tasks-db's DBTaskResult row and reads it back through the backend; tasks here are "
                "runs and their steps (refresh() and arefresh() pass in the backport's tests)"
            ),
            f"{TASKS_DB}DatabaseBackendTestCase.test_refresh_result_async": "as test_refresh_result",
            f"{TASKS_DB}DatabaseBackendTestCase.test_get_result": (
                "counts queries: django-tasks-db reads a result from its one row in one query, this backend reads "
                "the run and its attempts in two"
            ),
            f"{TASKS_DB}DatabaseBackendTestCase.test_doesnt_wait_until_transaction_commit": (
                "counts DBTaskResult rows; what it holds, the task written in the caller's transaction, holds here "
                "too (tests/tasks/test_backend.py)"
            ),
            f"{TASKS_DB}DatabaseBackendTestCase.test_index_scan_for_ready": "the query plan of DBTaskResult's index",
            f"{TASKS_DB}DatabaseBackendTestCase.test_run_after_tz": "reads the task back from its DBTaskResult row",
            f"{TASKS_DB}DatabaseBackendTestCase.test_run_after_null_0016_migration": (
                "a value django-tasks-db's migration 0016 wrote in DBTaskResult rows"
            ),
            f"{TASKS_DB}DatabaseBackendTestCase.test_database_backend_app_missing": (
                "expects a hint naming django_tasks_db; WorkflowsBackend's check E015 names pgbus_workflows"
            ),
            **{
                f"{TASKS_DB}DatabaseBackendTestCase.{name}": "django-tasks-db's own id_function option"
                for name in (
                    "test_custom_id_function",
                    "test_unknown_id_function",
                    "test_postgres_db_id_function",
                    "test_postgres_id_function_expression",
                )
            },
            f"{TASKS_DB}DatabaseBackendWorkerTestCase": "drives django-tasks-db's db_worker command and its rows",
            f"{TASKS_DB}DatabaseTaskResultTestCase": "django-tasks-db's DBTaskResult queryset and its row locks",
            f"{TASKS_DB}ConnectionExclusiveTranscationTestCase": "django-tasks-db's transaction helper",
            f"{TASKS_DB}DatabaseBackendPruneTaskResultsTestCase": "django-tasks-db's prune_db_task_results command",
            f"{TASKS_DB}DatabaseWorkerProcessTestCase": "starts django-tasks-db's db_worker processes",
            f"{TASKS_DB}CompatTestCase": "django-tasks-db's compat module",
        },
    ),
}


def fetch(requirement: str, into: Path) -> Path:
    """``requirement``'s wheel from the package index, unpacked in ``into``: the folder to import it from."""
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:"]
    subprocess.run([*pip, requirement, "--dest", str(into)], check=True)
    [wheel] = into.glob("*.whl")
    site = into / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def settings_of(name: str) -> dict[str, Any]:
    """Suite ``name``'s settings: the upstream runs' (``tests.upstream.settings``), with its apps, URLs, tasks
    and a test database of its own (the suites run side by side)."""
    from tests.upstream import settings

    suite = SUITES[name]
    values = copy.deepcopy({key: getattr(settings, key) for key in dir(settings) if key.isupper()})
    values.update(INSTALLED_APPS=suite.apps, TASKS=suite.tasks, ROOT_URLCONF=suite.urls or values["ROOT_URLCONF"])
    values["DATABASES"]["default"]["TEST"]["NAME"] += f"_{name}"
    return values


def use_the_suites_tests_package(suite: Suite) -> None:
    """Make ``tests`` the suite's package: its folder first on the path, ours out of ``sys.modules``."""
    for name in [name for name in sys.modules if name == "tests" or name.startswith("tests.")]:
        del sys.modules[name]
    sys.path.insert(0, str(suite.folder))


def skip_not_applicable(suite: Suite) -> None:
    """Skip each test or class the suite names as not applicable, with its reason (adaptation 3)."""
    for test_id, reason in suite.not_applicable.items():
        skip = unittest.skip(f"not applicable: {reason}")
        module_name, name = test_id.rsplit(".", 1)
        if name.startswith("test_"):
            module_name, class_name = module_name.rsplit(".", 1)
            cls = getattr(importlib.import_module(module_name), class_name)
            if name not in vars(cls):
                raise SystemExit(f"{test_id} is no longer in the suite's tests: update its not_applicable")
            setattr(cls, name, skip(getattr(cls, name)))
        else:
            module = importlib.import_module(module_name)
            if not hasattr(module, name):
                raise SystemExit(f"{test_id} is no longer in the suite's tests: update its not_applicable")
            setattr(module, name, skip(getattr(module, name)))


def run_suite(name: str) -> int:
    """Run one suite in this process; the exit status is the runner's (0: all passed or skipped)."""
    suite = SUITES[name]
    sys.dont_write_bytecode = True  # nothing written beside the vendored files
    with tempfile.TemporaryDirectory(prefix="pgbus-upstream-") as folder:
        if suite.fetched:
            sys.path.insert(0, str(fetch(f"{suite.distribution}=={suite.version}", Path(folder))))
        elif (installed := importlib.metadata.version(suite.distribution)) != suite.version:
            sys.stdout.write(
                f"{suite.distribution} {installed} is installed, the tests are {suite.version}'s: a failure may be "
                "a change of the backport's; vendor its tests again (tests/upstream/vendor/README.md)\n"
            )
        import django
        from django.conf import settings

        settings.configure(**settings_of(name))
        django.setup()
        from django.test import SimpleTestCase
        from django.test.runner import DiscoverRunner

        from pgbus_workflows.tasks import WorkflowsBackend
        from tests.upstream import backends

        use_the_suites_tests_package(suite)
        for stand_in in suite.stand_in_modules:  # adaptation 1
            sys.modules[stand_in] = backends
        for stand_in in suite.stand_in_classes:
            module_name, class_name = stand_in.rsplit(".", 1)
            setattr(importlib.import_module(module_name), class_name, WorkflowsBackend)
        SimpleTestCase.databases = {"default"}  # adaptation 2
        skip_not_applicable(suite)
        verbosity = int(os.environ.get("VERBOSITY", "1"))
        runner = DiscoverRunner(top_level=str(suite.folder), verbosity=verbosity, interactive=False)
        failures = runner.run_tests([suite.label])
    return 1 if failures else 0


def main(names: list[str]) -> int:
    """Run the named suites (all without names), side by side, each in a process of its own; 1 if any failed.

    Each suite's output is written when it ends, whole, after a line naming it.
    """
    if len(names) == 1:
        return run_suite(names[0])
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pgbus-upstream-") as folder:
        logs = {name: Path(folder, f"{name}.log") for name in names or list(SUITES)}
        command = [sys.executable, "-m", "tests.upstream.vendored"]
        with contextlib.ExitStack() as files:
            children = {
                name: subprocess.Popen(
                    [*command, name], cwd=ROOT, stdout=files.enter_context(log.open("w")), stderr=subprocess.STDOUT
                )
                for name, log in logs.items()
            }
            statuses = {name: child.wait() for name, child in children.items()}
        for name, log in logs.items():
            sys.stdout.write(f"== {name}: {SUITES[name].folder.name}'s tests against WorkflowsBackend ==\n")
            sys.stdout.write(log.read_text())
    sys.stdout.write(f"the upstream suites: {time.monotonic() - began:.0f} s\n")
    return 1 if any(statuses.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
