"""Settings of the example project.

The database is DATABASE_URL (django-environ) when it is set, else the SQLite file
``db.sqlite3`` at the top of the repository: the demo needs no database server. SQLite is
for development with one dispatcher; use PostgreSQL to run several.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env("DJANGO_SECRET_KEY", default="example-project-not-a-secret")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pgbus_workflows",
    # The example apps: their models, workflows.py, admin.py and tests.py.
    "example_project.signup",
    "example_project.shop",
    "example_project.gallery",
    "example_project.demo",  # manage.py demo
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A dispatcher's threads and the web process write to one file: IMMEDIATE takes the write
    # lock when a transaction begins (no "database is locked" when a read turns into a write),
    # and a writer waits up to 20 s for the lock instead of 5.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"transaction_mode": "IMMEDIATE", "timeout": 20})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

PGBUS_WORKFLOWS = {"SWEEP_INTERVAL": 30}

# How long the example workflows wait, in seconds. A real signup drip waits days and a real
# shop holds an unpaid order for hours; the example project uses seconds so that
# `manage.py demo` shows the waits, the retries and the payment timeout happen.
EXAMPLE_DURATIONS = {
    "signup_tips_after": 2,  # welcome email -> tips email (real life: 2 days)
    "signup_offer_after": 2,  # tips email -> upgrade offer (real life: 5 days)
    "payment_timeout": 4,  # an order waits this long for its payment (real life: 1 hour)
    "carrier_retry": 0.5,  # the carrier's backoff: at most this before the first call again, doubled each time
}
