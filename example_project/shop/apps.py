from django.apps import AppConfig


class ShopConfig(AppConfig):
    """Orders: payment, shipping."""

    name = "example_project.shop"
    label = "shop"  # stable: it names the tables and the runs' subject_type
    verbose_name = "Shop"
    default_auto_field = "django.db.models.BigAutoField"
