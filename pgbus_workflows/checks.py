"""System checks: the ``PGBUS_WORKFLOWS`` settings are valid and the database is supported."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import connections

from .conf import DEFAULTS, DURATION_KEYS, STALL_ACTIONS, as_duration

_POSITIVE_INTS = ("MAX_PAYLOAD_SIZE",)
_NON_EMPTY_STRINGS = ("DEFAULT_QUEUE", "NOTIFY_CHANNEL")


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
        if value is None and key == "RETENTION":
            continue
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
    for key in _NON_EMPTY_STRINGS:
        value = raw.get(key, "x")
        if not isinstance(value, str) or not value:
            errors.append(_error(key, f"must be a non-empty string, got {value!r}", "E007"))
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
