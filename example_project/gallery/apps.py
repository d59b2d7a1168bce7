from django.apps import AppConfig


class GalleryConfig(AppConfig):
    """Albums whose images get thumbnails in parallel."""

    name = "example_project.gallery"
    label = "gallery"  # stable: it names the tables and the runs' subject_type
    verbose_name = "Gallery"
    default_auto_field = "django.db.models.BigAutoField"
