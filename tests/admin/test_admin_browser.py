"""The operator console in a real browser: headless Chromium driven by Playwright.

An operator logs in, opens the dashboard, follows its "paused" link, opens the paused run
and resumes it with a reason; a user without the pause permission sees no resume button.
The tests also take the screenshots of the README and the docs: with UPDATE_SCREENSHOTS=1 they are saved
to docs/dashboard.png and docs/run.png, otherwise to a temporary folder.

Needs Debian's chromium at /usr/bin/chromium (``bash scripts/install_chromium``; another
binary: ``PGBUS_TEST_CHROMIUM=/path``) and ``pip install playwright``; ``playwright install``
is never needed. The tests are skipped when either is missing (``tests/project/test_readme_notes.py``
checks that they are).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgbus_workflows import OnException, Workflow, step
from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.models import Dispatcher, WorkflowEvent
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import PASSWORD, VIEW, staff_user
from tests.testapp.models import Order

#: Debian's chromium; PGBUS_TEST_CHROMIUM names another binary (Ubuntu's chromium-browser, say).
CHROMIUM = Path(os.environ.get("PGBUS_TEST_CHROMIUM", "/usr/bin/chromium"))
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install playwright")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"no {CHROMIUM}: run bash scripts/install_chromium (or set PGBUS_TEST_CHROMIUM)"
    ),
    pytest.mark.django_db(transaction=True),
]

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DOCS = Path(__file__).resolve().parents[2] / "docs"
UPDATE_SCREENSHOTS = os.environ.get("UPDATE_SCREENSHOTS") == "1"

helpers = WorkflowTestMixin()


class CarrierDown(ConnectionError):
    """The carrier's API did not answer."""


class AdminOrderFulfilment(Workflow):
    name = "admin_order_fulfilment"

    @step
    def reserve_stock(self):
        return {"reserved": self.arguments.get("items", [])}

    @step
    def book_courier(self):
        if self.arguments.get("carrier_down") and self.attempt == 1:
            raise CarrierDown("carrier API timed out after 30 s")
        return {"tracking": f"TRK-{self.subject.pk}"}

    @step(wait=timedelta(days=2))
    def ask_for_review(self):
        pass


class AdminInvoiceReminders(Workflow):
    name = "admin_invoice_reminders"
    exception_policies = [OnException(action="pause")]

    @step
    def send_invoice(self):
        pass

    @step(wait=timedelta(days=7))
    def first_reminder(self):
        pass


class AdminRefundApproval(Workflow):
    name = "admin_refund_approval"

    @step(wait_for="approved")
    def wait_for_approval(self):
        return self.received_signal.payload

    @step
    def refund(self):
        pass


def some_runs() -> Workflow:
    """A plausible mix of runs; returns the one paused by a failed attempt."""
    for items in (["mug"], ["tea", "pot"], ["kettle"]):
        helpers.speedrun_workflow(AdminOrderFulfilment.start(Order.objects.create(), items=items))
    for _ in range(2):
        helpers.perform_next_step(AdminOrderFulfilment.start(Order.objects.create(), items=["socks"]))
    for _ in range(4):
        helpers.perform_next_step(AdminInvoiceReminders.start(Order.objects.create()))
    AdminInvoiceReminders.start(Order.objects.create()).cancel(actor="bob", reason="customer paid by phone")
    for _ in range(2):
        helpers.perform_next_step(AdminRefundApproval.start(Order.objects.create()))
    Dispatcher.objects.create(name="worker-1:4242", hostname="worker-1", pid=4242, queues=["workflows"], concurrency=8)
    failing = AdminOrderFulfilment.start(Order.objects.create(), items=["lamp", "bulb"], carrier_down=True)
    helpers.perform_next_step(failing)
    helpers.perform_next_step(failing)
    assert failing.reload().status == "paused"
    return failing


@contextmanager
def browser_page(live_server: Any) -> Iterator[Any]:
    """A fresh page in headless Chromium. Playwright's sync API keeps an event loop running in
    this thread, where Django refuses ORM calls: prepare rows before, check them after."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


def log_in(page: Any, live_server: Any, username: str) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")


def test_operator_resumes_a_paused_run_from_the_dashboard(live_server, django_user_model, monkeypatch, tmp_path):
    shots = DOCS if UPDATE_SCREENSHOTS else tmp_path
    # The dashboard lists every registered class; the screenshot shows only these.
    demo = (AdminOrderFulfilment, AdminInvoiceReminders, AdminRefundApproval)
    monkeypatch.setattr(registry, "_registry", {cls.name: cls for cls in demo})
    failing = some_runs()
    staff_user(django_user_model, "alice", *VIEW, "pause_workflowrun", "cancel_workflowrun", "skip_workflowrun")

    with browser_page(live_server) as page:
        log_in(page, live_server, "alice")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/")
        page.click("text=Dashboard")
        page.wait_for_selector("svg.pgbus-chart")
        shots.mkdir(exist_ok=True)
        page.screenshot(path=str(shots / "dashboard.png"), full_page=True)

        page.click("#runs-by-status tr.pgbus-total a[href$='?status=paused']")
        page.wait_for_selector("#result_list")
        assert "status=paused" in page.url
        page.click(f"#result_list a:has-text('{str(failing.workflow_id)[:8]}')")
        page.wait_for_selector("#timeline")
        assert page.locator(".pgbus-error").first.inner_text() == f"{__name__}.CarrierDown"
        # The stylesheet (ModelAdmin.Media, served as a static file) is applied: badges are coloured.
        colour = page.eval_on_selector(".pgbus-badge", "e => getComputedStyle(e).backgroundColor")
        assert colour not in ("rgba(0, 0, 0, 0)", "transparent"), colour
        page.screenshot(path=str(shots / "run.png"), full_page=True)

        page.click("a.pgbus-op-resume")
        page.fill("#id_reason", "carrier is back up")
        page.click("input[type=submit][value=Resume]")
        page.wait_for_selector("#timeline")
        assert "resumed" in page.locator("ul.messagelist").inner_text()
        resumed = page.locator("tr.pgbus-event-resumed")
        assert resumed.count() == 1
        assert "alice" in resumed.inner_text() and "carrier is back up" in resumed.inner_text()
        assert page.locator("a.pgbus-op-resume").count() == 0
        assert page.locator("a.pgbus-op-pause").count() == 1

    event = WorkflowEvent.objects.filter(run_id=failing.record.pk, kind="resumed").get()
    assert (event.actor, event.reason) == ("alice", "carrier is back up")
    assert failing.reload().status == "ready"


def test_user_without_pause_permission_sees_no_resume_button(live_server, django_user_model):
    failing = some_runs()
    staff_user(django_user_model, "victor", *VIEW, "cancel_workflowrun")

    with browser_page(live_server) as page:
        log_in(page, live_server, "victor")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/{failing.record.pk}/change/")
        page.wait_for_selector("#timeline")
        assert page.locator("a.pgbus-op-resume").count() == 0
        assert page.locator("a.pgbus-op-cancel").count() == 1
        response = page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/{failing.record.pk}/resume/")
        assert response is not None and response.status == 403

    assert failing.reload().status == "paused"


def test_a_user_who_may_only_view_runs_sees_no_attempts_events_signals_or_dispatchers(live_server, django_user_model):
    failing = some_runs()
    staff_user(django_user_model, "wendy", "view_workflowrun", "pause_workflowrun")

    with browser_page(live_server) as page:
        log_in(page, live_server, "wendy")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/{failing.record.pk}/change/")
        page.wait_for_selector("#content-main")
        for section in ("#timeline", "#events", "#signals"):
            assert page.locator(section).count() == 0, section
        assert "Traceback" not in page.content()  # tracebacks are on the attempts
        assert page.locator("a.pgbus-op-resume").count() == 1  # her permission on the run itself
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/dashboard/")
        page.wait_for_selector("#runs-by-status")
        assert page.locator("#dispatchers").count() == 0
        assert "worker-1" not in page.content()


def test_an_operator_delivers_a_signal_choosing_from_the_names_the_step_waits_for(live_server, django_user_model):
    order = Order.objects.create()
    waiting = AdminRefundApproval.start(order)
    helpers.perform_next_step(waiting)
    assert waiting.reload().status == "waiting"
    staff_user(django_user_model, "sam", *VIEW, "signal_workflowrun")

    with browser_page(live_server) as page:
        log_in(page, live_server, "sam")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/{waiting.record.pk}/change/")
        page.click("a.pgbus-op-signal")
        name = page.locator("select#id_name")
        assert name.input_value() == "approved"  # the name the step waits for, chosen already
        assert name.locator("optgroup").first.get_attribute("label") == "Waited for now"
        page.fill("#id_payload", '{"amount": 12}')
        page.fill("#id_reason", "refund approved on the phone")
        page.click("input[type=submit]")
        page.wait_for_selector("#timeline")
        assert "Signal “approved” delivered" in page.locator("ul.messagelist").inner_text()

    assert waiting.reload().status == "ready"
    assert waiting.signals.get().payload == {"amount": 12}


def test_an_operator_sees_the_schedules_and_pauses_one_with_a_reason(live_server, django_user_model, tmp_path):
    from pgbus_workflows.testing import tick_schedules
    from tests.testapp.workflows import Ticked

    start = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    nightly = Ticked.add_schedule(cron="30 2 * * *", timezone="Europe/Paris", name="nightly report")
    quarter = Ticked.add_schedule(every=timedelta(minutes=15), start_at=start, name="reminder sweep")
    [run] = tick_schedules(now=start + timedelta(minutes=15))
    staff_user(django_user_model, "paula", "view_workflowschedule", "view_workflowrun", "pause_workflowschedule")

    with browser_page(live_server) as page:
        log_in(page, live_server, "paula")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowschedule/")
        page.wait_for_selector("#result_list")
        table = page.locator("#result_list").inner_text()
        assert "At 02:30 every day (Europe/Paris)" in table and "Every 15 minutes" in table
        assert "2026-06-01 12:15:00" in table  # the last run's tick, with its status
        page.screenshot(path=str(tmp_path / "schedules.png"), full_page=True)

        page.click("#result_list a:has-text('nightly report')")
        page.wait_for_selector("#schedule-events")
        assert page.locator("a.pgbus-op-fire_now").count() == 0  # no fire permission
        page.click("a.pgbus-op-pause")
        page.fill("#id_reason", "the report's database is migrating")
        page.click("input[type=submit][value=Pause]")
        page.wait_for_selector("#schedule-events")
        assert "paused" in page.locator("ul.messagelist").inner_text()
        paused = page.locator("tr.pgbus-schedule-event-paused")
        assert "paula" in paused.inner_text() and "migrating" in paused.inner_text()
        assert page.locator("a.pgbus-op-resume").count() == 1

        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/{run.record.pk}/change/")
        page.click("a:has-text('reminder sweep')")
        page.wait_for_selector("#schedule-events")
        assert f"/workflowschedule/{quarter.pk}/change/" in page.url

    nightly.refresh_from_db()
    assert nightly.paused
    assert nightly.events.get(kind="paused").reason == "the report's database is migrating"
