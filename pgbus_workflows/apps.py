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
        from . import checks, deploy_checks  # noqa: F401 - registers the system checks
        from .services import fanout  # noqa: F401 - resolves a parent's fan-out when a child run ends

        post_migrate.connect(_install_functions, sender=self, dispatch_uid="pgbus_workflows_functions")


def _install_functions(sender: AppConfig, using: str, **kwargs: Any) -> None:
    """After ``migrate``: ``start()``'s server-side function for the tables as they now are (``sql.functions``)."""
    from .sql import functions

    functions.install(using)


class PgbusWorkflowsConfig(SimplePgbusWorkflowsConfig):
    """The default config: imports every installed app's ``workflows`` module."""

    default = True

    def ready(self) -> None:
        super().ready()
        from .dsl.declared import autodiscover  # in ready(): the app registry is ready now

        autodiscover()
