"""The URL configuration docs/metrics.md shows for the metrics view (tests/faces/test_metrics.py)."""

from django.urls import path

import pgbus_workflows.metrics

urlpatterns = [path("metrics/", pgbus_workflows.metrics.metrics_view)]
