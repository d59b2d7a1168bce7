"""The runs list at a common laptop width (1,400 px, the navigation and the filters open): its last column is on screen.

Headless Chromium, as in ``tests/admin/test_admin_browser.py`` (skipped without it).
"""

from __future__ import annotations

from tests.admin.test_admin_browser import browser_page, log_in, pytestmark, some_runs  # noqa: F401 (pytestmark applies here)
from tests.support import VIEW, staff_user

GEOMETRY = """() => {
  const results = document.querySelector('#changelist-form .results').getBoundingClientRect();
  const last = document.querySelector('#result_list thead th:last-child');
  const cell = document.querySelector('#result_list tbody tr:first-child td:last-child');
  return {results: results.right, head: last.getBoundingClientRect().right, cell: cell.getBoundingClientRect().right,
          heading: last.innerText.trim(), page: document.documentElement.scrollWidth, viewport: window.innerWidth};
}"""


def test_the_runs_list_s_last_column_is_on_screen_at_1400_px(live_server, django_user_model):
    some_runs()
    staff_user(django_user_model, "alice", *VIEW)
    with browser_page(live_server) as page:  # 1,400 x 900
        log_in(page, live_server, "alice")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/")
        page.wait_for_selector("#result_list")
        assert page.locator("#nav-sidebar").is_visible() and page.locator("#changelist-filter").is_visible()
        seen = page.evaluate(GEOMETRY)
    assert seen["heading"] == "AGE"
    assert seen["head"] <= seen["results"] + 1, seen  # not past the list's box, where it would be clipped
    assert seen["cell"] <= seen["results"] + 1, seen
    assert seen["page"] <= seen["viewport"], seen
