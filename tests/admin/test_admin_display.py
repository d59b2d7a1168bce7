"""What a newcomer reads in the admin: totals filled in, counts with separators, words in the right number."""

import pytest
from django.urls import reverse

from tests.management.test_cli import paused_on_error, ready

pytestmark = pytest.mark.django_db


def test_the_dashboard_s_all_classes_row_has_the_grand_total(admin_client):
    ready(), ready(), paused_on_error()
    response = admin_client.get(reverse("admin:pgbus_workflows_workflowrun_dashboard"))
    assert response.context["grand_total"]["count"] == 3
    all_runs = reverse("admin:pgbus_workflows_workflowrun_changelist")
    assert f'<td class="pgbus-num pgbus-grand-total"><a href="{all_runs}">3</a></td>' in response.content.decode()
