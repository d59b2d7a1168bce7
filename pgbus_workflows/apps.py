"""The app configs: the default one autodiscovers ``workflows`` modules, the simple one does not."""

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class SimplePgbusWorkflowsConfig(AppConfig):
    """pgbus_workflows without autodiscovery (register classes by importing them yourself)."""

    name = "pgbus_workflows"
    label = "pgbus_workflows"
    verbose_name = _("Workflows")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the system checks and the install of ``start()``'s function after ``migrate``.

        Then make the workflow class of each ``TASKS`` alias this app's backend serves.
        """
        from . import checks, deploy_checks  # noqa: F401 - registers the system checks

        post_migrate.connect(_install_functions, sender=self, dispatch_uid="pgbus_workflows_functions")
        _register_task_classes()


def _register_task_classes() -> None:
    """The workflow class of each ``TASKS`` alias this app's backend serves, made now so dispatchers know it.

    A backend path that does not import is left to Django's own check; ours failing to import
    (Django 5.2 without the backport) raises its ``ImproperlyConfigured`` here, at startup.
    """
    from django.conf import settings
    from django.utils.module_loading import import_string

    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return
    for alias, params in configured.items():
        path = params.get("BACKEND") if isinstance(params, dict) else None
        if not isinstance(path, str):
            continue
        try:
            backend = import_string(path)
        except ImportError:
            continue
        if getattr(backend, "serves_workflow_tasks", False):
            from .exceptions import ConfigurationError
            from .tasks.runs import task_workflow

            try:
                task_workflow(alias, params.get("OPTIONS") or {})
            except ConfigurationError:
                pass  # the backend's check() reports it, and its enqueue raises it


def _install_functions(sender: AppConfig, using: str, **kwargs: Any) -> None:
    """After ``migrate``: ``start()``'s server-side function for the tables as they now are (``sql.functions``)."""
    from .sql import functions

    functions.install(using)


class PgbusWorkflowsConfig(SimplePgbusWorkflowsConfig):
    """The default config: imports every installed app's ``workflows`` module."""

    default = True

    def ready(self) -> None:
        """Do what the simple config does, then import every installed app's ``workflows`` module."""
        super().ready()
        from .dsl.declared import autodiscover  # in ready(): the app registry is ready now

        autodiscover()
