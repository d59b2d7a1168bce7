from django.apps import AppConfig


class DemoConfig(AppConfig):
    """``manage.py demo``: the example workflows, run by a real dispatcher, live in the terminal."""

    name = "example_project.demo"
    label = "demo"
    verbose_name = "Demo"
