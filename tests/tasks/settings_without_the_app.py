"""A project that names ``WorkflowsBackend`` in ``TASKS`` but forgot ``pgbus_workflows`` in ``INSTALLED_APPS``."""

SECRET_KEY = "not-a-secret"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
TASKS = {"default": {"BACKEND": "pgbus_workflows.tasks.WorkflowsBackend"}}
