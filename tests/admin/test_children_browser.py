"""Child workflows in a real browser: from a parent's page to a child's and back; the children's
statuses follow a child that ends while the parent's page is open (the page refreshes itself).
"""

from __future__ import annotations

from pgbus_workflows.admin import run_page as admin_run_page
from pgbus_workflows.testing import WorkflowTestMixin
from tests.admin.test_admin_browser import browser_page, log_in, pytestmark  # noqa: F401 (pytestmark: the skips)
from tests.management.test_cli_processes import finish, manage
from tests.support import VIEW, staff_user
from tests.testapp.child_workflows import Many

helpers = WorkflowTestMixin()


def statuses(page) -> list[str]:
    return page.eval_on_selector_all("#family tr.pgbus-child .pgbus-badge", "bs => bs.map(b => b.innerText.trim())")


def test_an_operator_goes_from_a_parent_to_its_child_and_sees_the_children_move(
    live_server, django_user_model, monkeypatch
):
    monkeypatch.setattr(admin_run_page, "REFRESH_SECONDS", 1)
    parent = helpers.perform_next_step(Many.start(count=2))
    first, second = parent.children
    staff_user(django_user_model, "cora", *VIEW, "cancel_workflowrun")

    with browser_page(live_server) as page:
        log_in(page, live_server, "cora")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/{parent.record.pk}/change/")
        page.wait_for_selector("#family tr.pgbus-child")
        assert statuses(page) == ["ready", "ready"]
        assert "2 children" in page.locator("#family .pgbus-children-counts").inner_text()

        # Another process cancels the second child: the open parent page follows.
        code, _out, err = finish(manage("cancel", str(second.workflow_id), "--reason", "not needed"))
        assert code == 0, err
        page.wait_for_function(
            "() => [...document.querySelectorAll('#family tr.pgbus-child .pgbus-badge')]"
            ".map(b => b.innerText.trim()).join() === 'ready,cancelled'",
            timeout=15_000,
        )

        page.click(f"#family a:text('{str(first.workflow_id)[:8]}')")
        page.wait_for_url(f"**/workflowrun/{first.record.pk}/change/")
        assert "Started by" in page.locator("#family .pgbus-parent").inner_text()
        page.click("#family .pgbus-parent a")
        page.wait_for_url(f"**/workflowrun/{parent.record.pk}/change/")
        page.wait_for_selector("#family tr.pgbus-child")
