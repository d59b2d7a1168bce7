"""The app's management package: Django finds its ``manage.py`` commands in ``commands``."""
