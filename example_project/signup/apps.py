from django.apps import AppConfig


class SignupConfig(AppConfig):
    """Sign-ups and their email drip."""

    name = "example_project.signup"
    label = "signup"  # stable: it names the tables and the runs' subject_type
    verbose_name = "Signups"
    default_auto_field = "django.db.models.BigAutoField"
