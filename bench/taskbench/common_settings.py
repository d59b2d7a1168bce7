"""What both backends' settings share: the database (``TASKBENCH_DATABASE_URL``) and the tasks app."""

import os

SECRET_KEY = "bench-not-a-secret"  # noqa: S105 - a benchmark project, never served
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "bench.taskbench"]


def database(url: str) -> dict[str, object]:
    """A ``DATABASES`` entry from a ``postgres://user@host:port/name`` URL (no password)."""
    rest = url.split("://", 1)[1]
    user, rest = rest.split("@", 1)
    hostport, name = rest.split("/", 1)
    host, _, port = hostport.partition(":")
    return {"ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": user, "HOST": host, "PORT": port or "5432"}


DATABASES = {"default": database(os.environ["TASKBENCH_DATABASE_URL"])}
