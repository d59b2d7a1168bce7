"""The insights page in a real browser: from the dashboard's "insights" link to the class's charts.

With UPDATE_SCREENSHOTS=1 the page is saved as docs/insights.png (the operating guide's screenshot),
otherwise to a temporary folder. Skipped as the other browser tests are, without Chromium or Playwright.
"""

from __future__ import annotations

import pytest

from pgbus_workflows.dsl.declared import registry
from tests.admin.test_admin_browser import (
    CHROMIUM,
    DOCS,
    UPDATE_SCREENSHOTS,
    AdminInvoiceReminders,
    AdminOrderFulfilment,
    AdminRefundApproval,
    browser_page,
    log_in,
    some_runs,
)
from tests.support import VIEW, staff_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no {CHROMIUM}: run bash scripts/install_chromium"),
    pytest.mark.django_db(transaction=True),
]


def test_an_operator_opens_a_class_insights_from_the_dashboard_and_picks_a_window(
    live_server, django_user_model, monkeypatch, tmp_path
):
    shots = DOCS if UPDATE_SCREENSHOTS else tmp_path
    demo = (AdminOrderFulfilment, AdminInvoiceReminders, AdminRefundApproval)
    monkeypatch.setattr(registry, "_registry", {cls.name: cls for cls in demo})
    some_runs()
    staff_user(django_user_model, "carol", *VIEW)

    with browser_page(live_server) as page:
        log_in(page, live_server, "carol")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/dashboard/")
        page.click("#runs-by-status tr:has(th a:text-is('admin_order_fulfilment')) a.pgbus-insights-link")
        page.wait_for_selector("#funnel svg.pgbus-chart")
        assert page.url.endswith("/insights/admin_order_fulfilment/")
        assert page.locator("svg.pgbus-chart").count() == 3
        funnel = page.locator("#funnel").inner_text()
        assert "6 runs started; 3 finished." in funnel
        performance = page.locator("#performance").inner_text()
        assert "book_courier" in performance and "P95" in performance.upper()  # headers are upper-cased by CSS
        # the stylesheet colours the bars by status
        fill = page.eval_on_selector("#pipeline rect.pgbus-bar", "e => getComputedStyle(e).fill")
        assert fill not in ("", "none", "rgb(0, 0, 0)"), fill
        shots.mkdir(exist_ok=True)
        page.screenshot(path=str(shots / "insights.png"), full_page=True)

        page.click("#window a:text-is('7d')")
        page.wait_for_selector("#window strong:text-is('7d')")
        assert page.url.endswith("?window=7d")
