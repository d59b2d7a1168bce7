"""Settings of the upstream task tests run against ``WorkflowsBackend`` (``run.py``, and ``vendored.py`` from them).

The test suite's settings (PostgreSQL from ``DATABASE_URL``), with a test database of their
own so that the run can go beside the suite's, and Django's PostgreSQL backend.
"""

from tests.settings import *  # noqa: F403 - the suite's settings, and two changes below

DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_upstream"}  # noqa: F405
# Django's own backend, not the suite's (``tests.backend``): an upstream suite's package named
# ``tests`` stands where ours would be.
for alias in DATABASES.values():  # noqa: F405
    if alias["ENGINE"] == "tests.backend":
        alias["ENGINE"] = "django.db.backends.postgresql"
TASKS = {"default": {"BACKEND": "pgbus_workflows.tasks.WorkflowsBackend"}}
