"""Settings of the test project: PostgreSQL from DATABASE_URL (django-environ)."""

import json
import os

import environ

env = environ.Env()

SECRET_KEY = "tests-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pgbus_workflows",
    "tests.testapp",
    "example_project.signup",
    "example_project.shop",
    "example_project.gallery",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": env.db("DATABASE_URL", default="postgres://root@127.0.0.1:5432/pgbus_workflows")}
# Django's PostgreSQL backend with a flush that truncates only what a test wrote (tests/backend).
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "tests.backend"
# A READ_DATABASE for the replica tests: the default database again (a test mirror, so the in-process
# tests read what they wrote), or a real streaming replica (READ_DATABASE_URL, test_replica_processes.py).
DATABASES["replica"] = {
    **(env.db("READ_DATABASE_URL") if "READ_DATABASE_URL" in os.environ else DATABASES["default"]),
    "TEST": {"MIRROR": "default"},
}
STATIC_URL = "static/"
# The tests log users in hundreds of times: a fast hash, as Django's testing docs advise (never in production).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
# Dispatcher subprocesses started by the tests get short thresholds through this variable.
PGBUS_WORKFLOWS = {"MAX_PAYLOAD_SIZE": 4096, **json.loads(os.environ.get("PGBUS_WORKFLOWS_JSON", "{}"))}
# The task backend (pgbus_workflows.tasks): Django 6's django.tasks, or the django-tasks backport.
TASKS = {
    "default": {"BACKEND": "pgbus_workflows.tasks.WorkflowsBackend", "QUEUES": ["default", "emails"]},
    "retrying": {"BACKEND": "pgbus_workflows.tasks.WorkflowsBackend", "OPTIONS": {"ATTEMPTS": 3, "BACKOFF": 0.01}},
}
