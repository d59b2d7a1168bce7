"""System checks: valid ``PGBUS_WORKFLOWS`` settings, a supported database, one dispatcher on SQLite, limits.

With ``--database default``, also the pending fan-out jobs whose function this code cannot
import (the other checks of rows against code are in ``deploy_checks``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import DatabaseError, connections
from django.db.models import Count

from .conf import DEFAULTS, DURATION_KEYS, STALL_ACTIONS, as_duration, settings
from .dsl.declared import registry
from .dsl.jobs import resolve_job
from .dsl.limits import declared_limits
from .exceptions import ConfigurationError
from .models import Dispatcher, FanOutJob, JobStatus, WorkflowStep
from .services.children import CHILD_PREFIX
from .services.limiting import undeclared_names
from .sql import clock
from .states import StepStatus

#: When a check runs: with every ``manage.py check`` (runserver and migrate run it too), or
#: with ``check --database default`` only, as it reads rows.
EVERY_CHECK, DATABASE_CHECK = "every check", "check --database default"

#: Every system check message this app gives, by id: when it runs and what it finds. The
#: settings and checks reference of the docs is drawn from it; a test holds it to the ids the
#: code gives (here, in ``deploy_checks`` and in the tasks backend).
CHECKS: dict[str, tuple[str, str]] = {
    "pgbus_workflows.E001": (EVERY_CHECK, "``PGBUS_WORKFLOWS`` is not a dict."),
    "pgbus_workflows.E002": (EVERY_CHECK, "``PGBUS_WORKFLOWS`` has a key this version does not know (a typo)."),
    "pgbus_workflows.E003": (EVERY_CHECK, "A duration setting is neither seconds nor a ``timedelta``."),
    "pgbus_workflows.E004": (EVERY_CHECK, "A duration setting is zero or negative (``RETENTION`` may be 0 or None)."),
    "pgbus_workflows.E005": (EVERY_CHECK, "``STALL_ACTION`` is not reattempt, pause or cancel."),
    "pgbus_workflows.E006": (
        EVERY_CHECK,
        "``MAX_PAYLOAD_SIZE``, ``BATCH_SIZE``, ``MAX_CHILD_DEPTH`` or ``MCP_MAX_RESPONSE_BYTES`` is not >= 1.",
    ),
    "pgbus_workflows.E007": (EVERY_CHECK, "``DEFAULT_QUEUE`` or ``NOTIFY_CHANNEL`` is not a non-empty string."),
    "pgbus_workflows.E008": (EVERY_CHECK, "``AUTODISCOVER_MODULE`` is neither a module name nor None."),
    "pgbus_workflows.E009": (EVERY_CHECK, "``MAX_STALLS`` is neither an integer >= 0 nor None."),
    "pgbus_workflows.E010": (
        EVERY_CHECK,
        "``NOTIFY_CHANNEL`` is over 63 bytes (PostgreSQL would truncate it) or ``DEFAULT_QUEUE`` over 255.",
    ),
    "pgbus_workflows.E011": (EVERY_CHECK, "``PREPARED_STATEMENTS`` is not True or False."),
    "pgbus_workflows.E012": (EVERY_CHECK, "``ASYNC_CONCURRENCY`` is not an integer >= 0."),
    "pgbus_workflows.E013": (EVERY_CHECK, "A ``TASKS`` alias using the workflows backend has bad ``OPTIONS``."),
    "pgbus_workflows.E014": (EVERY_CHECK, "``MCP_WRITE_TOOLS`` or ``MCP_SHOW_PAYLOADS`` is not True or False."),
    "pgbus_workflows.E015": (EVERY_CHECK, "A ``TASKS`` alias uses the workflows backend without the app installed."),
    "pgbus_workflows.E016": (
        EVERY_CHECK,
        "A database router sends the reads or writes of the app's models to another database than ``default``.",
    ),
    "pgbus_workflows.E017": (EVERY_CHECK, "``READ_DATABASE`` is not an alias of ``DATABASES``."),
    "pgbus_workflows.W001": (DATABASE_CHECK, "The default database is neither PostgreSQL nor SQLite."),
    "pgbus_workflows.W002": (EVERY_CHECK, "Several dispatchers heartbeat on one SQLite database: it takes one."),
    "pgbus_workflows.W003": (
        EVERY_CHECK,
        'SQLite transactions are not ``"IMMEDIATE"``: dispatchers would fail with "database is locked".',
    ),
    "pgbus_workflows.W004": (
        EVERY_CHECK,
        "A workflow class has no ``name``: its runs store the dotted path, which a move orphans.",
    ),
    "pgbus_workflows.W005": (DATABASE_CHECK, "The rows cannot be compared with the code: unreachable or unmigrated."),
    "pgbus_workflows.W006": (DATABASE_CHECK, "Ongoing runs of a workflow class this code does not define."),
    "pgbus_workflows.W007": (DATABASE_CHECK, "Ongoing runs on a step their class no longer defines."),
    "pgbus_workflows.W008": (DATABASE_CHECK, "Pending signals that no step of their run's class waits for."),
    "pgbus_workflows.W009": (DATABASE_CHECK, "Due steps in a queue no live dispatcher serves."),
    "pgbus_workflows.W010": (DATABASE_CHECK, "Enabled schedules of a workflow class this code does not define."),
    "pgbus_workflows.W011": (
        DATABASE_CHECK,
        "A function bearing the name of ``start()``'s that the tables' owner does not own (maybe planted).",
    ),
    "pgbus_workflows.W012": (DATABASE_CHECK, "Pending fan-out jobs whose function this code cannot import."),
    "pgbus_workflows.W013": (
        EVERY_CHECK,
        "A fixed ``Concurrency`` or ``RateLimit`` key declared twice with different limits.",
    ),
    "pgbus_workflows.W014": (
        DATABASE_CHECK,
        "Steps scheduled under a ``Concurrency`` or ``RateLimit`` no code declares any more (claimed within its row).",
    ),
    "pgbus_workflows.I001": (DATABASE_CHECK, "Ongoing runs parked on ``removed_step()`` steps: keep them until 0."),
}

_POSITIVE_INTS = ("MAX_PAYLOAD_SIZE", "BATCH_SIZE", "MAX_CHILD_DEPTH", "MCP_MAX_RESPONSE_BYTES")
_NON_EMPTY_STRINGS = ("DEFAULT_QUEUE", "NOTIFY_CHANNEL")
#: The switches of ``manage.py workflows_mcp``: a string such as "false" would read as true.
_MCP_SWITCHES = ("MCP_WRITE_TOOLS", "MCP_SHOW_PAYLOADS")
#: PostgreSQL truncates identifiers (a LISTEN channel) to 63 bytes; queue names are varchar(255).
_MAX_BYTES = {"DEFAULT_QUEUE": 255, "NOTIFY_CHANNEL": 63}


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every ``PGBUS_WORKFLOWS`` key is known and has a value of the right kind."""
    raw = getattr(django_settings, "PGBUS_WORKFLOWS", {})
    if not isinstance(raw, dict):
        return [Error("PGBUS_WORKFLOWS must be a dict.", id="pgbus_workflows.E001")]
    errors: list[CheckMessage] = []
    for key in sorted(set(raw) - set(DEFAULTS)):
        errors.append(
            Error(
                f"PGBUS_WORKFLOWS has an unknown key {key!r}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="pgbus_workflows.E002",
            )
        )
    for key in sorted(set(raw) & DURATION_KEYS):
        value = raw[key]
        if key == "RETENTION" and (value is None or (not isinstance(value, bool) and value in (0, timedelta(0)))):
            continue  # keep forever
        try:
            duration = as_duration(value)
        except (TypeError, ValueError, OverflowError):
            errors.append(_error(key, f"must be seconds or a timedelta, got {value!r}", "E003"))
            continue
        if duration <= timedelta(0):
            errors.append(_error(key, f"must be > 0, got {value!r}", "E004"))
    if "STALL_ACTION" in raw and raw["STALL_ACTION"] not in STALL_ACTIONS:
        errors.append(
            _error("STALL_ACTION", f"must be one of {', '.join(STALL_ACTIONS)}, got {raw['STALL_ACTION']!r}", "E005")
        )
    for key in _POSITIVE_INTS:
        value = raw.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(_error(key, f"must be a positive integer, got {value!r}", "E006"))
    awaiting = raw.get("ASYNC_CONCURRENCY", 0)
    if isinstance(awaiting, bool) or not isinstance(awaiting, int) or awaiting < 0:
        errors.append(_error("ASYNC_CONCURRENCY", f"must be an integer >= 0, got {awaiting!r}", "E012"))
    stalls = raw.get("MAX_STALLS", 0)
    if stalls is not None and (isinstance(stalls, bool) or not isinstance(stalls, int) or stalls < 0):
        errors.append(_error("MAX_STALLS", f"must be an integer >= 0 or None, got {stalls!r}", "E009"))
    for key in _NON_EMPTY_STRINGS:
        value = raw.get(key, "x")
        if not isinstance(value, str) or not value:
            errors.append(_error(key, f"must be a non-empty string, got {value!r}", "E007"))
        elif len(value.encode("utf-8")) > _MAX_BYTES[key]:
            errors.append(_error(key, f"must be at most {_MAX_BYTES[key]} bytes, got {len(value.encode())}", "E010"))
    if not isinstance(raw.get("PREPARED_STATEMENTS", True), bool):
        errors.append(
            _error("PREPARED_STATEMENTS", f"must be True or False, got {raw['PREPARED_STATEMENTS']!r}", "E011")
        )
    for key in _MCP_SWITCHES:
        if not isinstance(raw.get(key, False), bool):
            errors.append(_error(key, f"must be True or False, got {raw[key]!r}", "E014"))
    read = raw.get("READ_DATABASE", "default")
    if not isinstance(read, str) or read not in django_settings.DATABASES:
        aliases = ", ".join(repr(alias) for alias in django_settings.DATABASES)
        errors.append(_error("READ_DATABASE", f"must be an alias of DATABASES ({aliases}), got {read!r}", "E017"))
    module = raw.get("AUTODISCOVER_MODULE", "workflows")
    if module is not None and (not isinstance(module, str) or not module):
        errors.append(_error("AUTODISCOVER_MODULE", f"must be a module name or None, got {module!r}", "E008"))
    return errors


def _error(key: str, problem: str, code: str) -> Error:
    return Error(f"PGBUS_WORKFLOWS[{key!r}] {problem}.", id=f"pgbus_workflows.{code}")


@register(Tags.database)
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """PostgreSQL is the production database; SQLite works for one dispatcher only."""
    if not databases or "default" not in databases:
        return []
    vendor = connections["default"].vendor
    if vendor in ("postgresql", "sqlite"):
        return []
    return [
        CheckWarning(
            f"pgbus_workflows is untested on the {vendor} database.",
            hint="Use PostgreSQL 14+ in production (SQLite for development).",
            id="pgbus_workflows.W001",
        )
    ]


@register(Tags.compatibility)
def check_routing(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every row of the app lives on the ``default`` database, where its own SQL (claims, locks) runs."""
    from django.apps import apps
    from django.db import DEFAULT_DB_ALIAS, router

    errors: list[CheckMessage] = []
    for model in apps.get_app_config("pgbus_workflows").get_models():
        for what, alias in (("reads", router.db_for_read(model)), ("writes", router.db_for_write(model))):
            if alias != DEFAULT_DB_ALIAS:
                errors.append(
                    Error(
                        f"DATABASE_ROUTERS send the {what} of {model.__name__} to {alias!r}: pgbus_workflows "
                        "keeps every row on the 'default' database, where its claims and row locks run.",
                        hint="Have the routers return None (or 'default') for the pgbus_workflows app label; "
                        "running runs over several databases: docs/explanation/past-one-primary.md.",
                        obj=model,
                        id="pgbus_workflows.E016",
                    )
                )
    return errors


@register(Tags.database)
def check_job_functions(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Pending fan-out jobs whose function this code cannot import (``check --database default``)."""
    if not databases or "default" not in databases:
        return []
    try:
        if FanOutJob._meta.db_table not in connections["default"].introspection.table_names():
            return []  # a fresh database: no jobs yet
        pending = (
            FanOutJob.objects.filter(status=JobStatus.PENDING)
            .exclude(function__startswith=CHILD_PREFIX)  # a child run, not a function
            .values_list("function")
            .annotate(n=Count("pk"))
        )
        counts = sorted(pending.order_by())
    except DatabaseError:
        return []  # check_rows_against_code (deploy_checks) says the database cannot be read, and why
    messages: list[CheckMessage] = []
    for path, count in counts:
        try:
            resolve_job(path)
        except ConfigurationError as error:
            messages.append(
                CheckWarning(
                    f"{count} pending fan-out job(s) of function {path!r}, which this code cannot run: {error}.",
                    hint="Deploy the code that defines it, or keep the function importable under that path until "
                    "its jobs have run: dispatchers leave such jobs pending for UNKNOWN_STEP_GRACE, then claim "
                    "them and they fail.",
                    id="pgbus_workflows.W012",
                )
            )
    return messages


def _sqlite_file_missing(alias: str) -> bool:
    """True when the SQLite database of ``alias`` is a file that does not exist yet.

    Connecting would create an empty file: ``manage.py check`` on a fresh clone must not.
    """
    name = str(connections[alias].settings_dict.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
        return False
    return not os.path.exists(name)


@register(Tags.compatibility)
def check_sqlite_transaction_mode(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """On SQLite, transactions must take the write lock when they begin.

    With SQLite's default (deferred) transactions, a transaction that reads and then writes
    fails at once with "database is locked" when another connection writes meanwhile (the
    busy timeout cannot help): a dispatcher's threads and the web process then fail steps.
    """
    connection = connections["default"]
    if connection.vendor != "sqlite":
        return []
    mode = str(connection.settings_dict.get("OPTIONS", {}).get("transaction_mode") or "DEFERRED").upper()
    if mode in ("IMMEDIATE", "EXCLUSIVE"):
        return []
    return [
        CheckWarning(
            f"SQLite transactions are {mode}: a dispatcher will fail with 'database is locked' "
            "when another connection writes at the same time.",
            hint='Add "OPTIONS": {"transaction_mode": "IMMEDIATE"} to DATABASES["default"].',
            id="pgbus_workflows.W003",
        )
    ]


# Tagged ``compatibility``, not ``database``: database checks only run with ``check --database``,
# and this one must run with a plain ``manage.py check`` (it queries SQLite only, cheaply).
@register(Tags.compatibility)
def check_sqlite_dispatchers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """On SQLite, warn when several dispatchers heartbeat at once: it takes a single one."""
    connection = connections["default"]
    if connection.vendor != "sqlite" or _sqlite_file_missing("default"):
        return []

    try:
        if Dispatcher._meta.db_table not in connection.introspection.table_names():
            return []  # not migrated yet
        fresh_since = clock.now() - settings.DISPATCHER_DEAD_AFTER
        names = list(Dispatcher.objects.filter(heartbeat_at__gte=fresh_since).values_list("name", flat=True)[:10])
    except Exception:  # a check must not break `manage.py check`
        # The database cannot answer (DatabaseError), or may not be used here (pytest-django's
        # blocker raises RuntimeError): other checks and commands will say why.
        return []
    if len(names) < 2:
        return []
    return [
        CheckWarning(
            f"{len(names)} workflow dispatchers share the SQLite database ({', '.join(names)}).",
            hint=(
                "SQLite has no SKIP LOCKED and no advisory lock: run a single dispatcher "
                "(manage.py run_workflow_dispatcher), or use PostgreSQL to run several."
            ),
            id="pgbus_workflows.W002",
        )
    ]


@register(Tags.compatibility)
def check_shared_limit_keys(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A fixed ``Concurrency`` or ``RateLimit`` key declared twice with different limits.

    One key is one limiter row, whose limit is the declaration of the step scheduled last:
    two declarations that differ would set it in turn. (A callable key cannot be read here.)
    """
    declared: dict[tuple[str, str], dict[tuple[int, Any], list[str]]] = {}
    for cls in registry.classes():
        for definition in cls.step_definitions():
            for limit in declared_limits(cls, definition):
                if callable(limit.key):
                    continue
                kind = type(limit).__name__
                terms = (limit.limit, getattr(limit, "per", None))
                declared.setdefault((kind, limit.key), {}).setdefault(terms, []).append(f"{cls.name}.{definition.name}")
    messages: list[CheckMessage] = []
    for (kind, key), variants in sorted(declared.items()):
        if len(variants) < 2:
            continue
        where = "; ".join(
            f"{_terms(kind, terms)} by {', '.join(sorted(set(steps)))}" for terms, steps in variants.items()
        )
        messages.append(
            CheckWarning(
                f"The {kind} key {key!r} is declared with different limits: {where}.",
                hint="One key is one limiter, whose limit is written by whichever of these steps was scheduled "
                "last: declare the same limit everywhere (a shared constant), or use different keys.",
                id="pgbus_workflows.W013",
            )
        )
    return messages


@register(Tags.database)
def check_undeclared_limits(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Steps waiting under limiters that this code declares no more (``check --database default``).

    The claim takes them within the limiter rows' limits (the rows decide, not the code), so
    they run; the warning says that limits the code no longer shows still apply to them.
    Read through the partial index of scheduled attempts under limits (``pgbus_wf_step_limited``).
    """
    if not databases or "default" not in databases:
        return []
    try:
        if WorkflowStep._meta.db_table not in connections["default"].introspection.table_names():
            return []
        waiting = (
            WorkflowStep.objects.filter(status=StepStatus.SCHEDULED, held=False, limiters__isnull=False)
            .values_list("run__workflow_class", "step_name", "limiters")
            .annotate(n=Count("pk"))
            .order_by()
        )
        groups = list(waiting)
    except DatabaseError:
        return []  # check_rows_against_code (deploy_checks) says the database cannot be read, and why
    found: dict[tuple[str, str], tuple[int, set[str]]] = {}
    for klass, step_name, names, count in groups:
        if stray := undeclared_names(names or (), klass, step_name):
            total, seen = found.get((klass, step_name), (0, set()))
            found[(klass, step_name)] = (total + count, seen | set(stray))
    return [
        CheckWarning(
            f"{count} scheduled step(s) of {klass}.{step_name} wait on limiters no code declares any more: "
            f"{', '.join(sorted(names)[:5])}{' ...' if len(names) > 5 else ''}.",
            hint="Dispatchers claim them within those limiter rows' limits (the admin's list of limiters), "
            "until they have run; steps scheduled from now on are under what the code declares.",
            id="pgbus_workflows.W014",
        )
        for (klass, step_name), (count, names) in sorted(found.items())
    ]


def _terms(kind: str, terms: tuple[int, Any]) -> str:
    limit, per = terms
    return f"limit {limit}" if per is None else f"limit {limit} per {per}"
