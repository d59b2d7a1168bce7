"""A debounced run in the admin: its debounce key on its page and in the runs list, its collapses in its events."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils.html import escape

from pgbus_workflows import Debounce, Workflow, step
from tests.support import events_of, run_page
from tests.testapp.workflows import ThreeSteps

pytestmark = pytest.mark.django_db


class SyncAccount(Workflow):
    """Debounced per account: the second start collapses into the first one's run."""

    name = "admin_debounce_sync"
    allow_multiple = True
    step_options = {"queue": "admin_debounce"}
    debounce = Debounce(period=timedelta(seconds=30), key=lambda wf: f"account:{wf.arguments['account_id']}")

    @step
    def push(self):
        return None


def test_the_run_page_shows_the_debounce_key_and_each_collapse_with_its_note(admin_client):
    wf = SyncAccount.start(account_id=3, note="a")
    SyncAccount.start(account_id=3, note="b")
    [event] = events_of(wf, "debounced")

    page = admin_client.get(run_page(wf)).content.decode()
    assert '<div class="form-row field-debounce_key">' in page
    assert "account:3" in page
    row = page[page.index('<tr class="pgbus-event pgbus-event-debounced">') :]
    row = row[: row.index("</tr>")]
    assert f"<td>{escape(event.reason)}</td>" in row  # push moved from 12:00:30 to 12:00:45 UTC
    assert "previous_scheduled_at" in row and "&quot;note&quot;: &quot;b&quot;" in row


def test_the_runs_list_shows_the_debounce_key_under_the_class_of_a_run_that_has_one(admin_client):
    SyncAccount.start(account_id=4)
    ThreeSteps.start()
    page = admin_client.get(reverse("admin:pgbus_workflows_workflowrun_changelist")).content.decode()
    shown = '<div class="pgbus-muted pgbus-debounce-key" title="debounce key">account:4</div>'
    assert page.count('class="pgbus-muted pgbus-debounce-key"') == 1
    assert f'<td class="field-class_and_debounce_key">admin_debounce_sync{shown}</td>' in page
    assert '<td class="field-class_and_debounce_key">three_steps</td>' in page


def test_a_run_without_a_debounce_key_has_no_such_field(admin_client):
    page = admin_client.get(run_page(ThreeSteps.start())).content.decode()
    assert "field-debounce_key" not in page
