"""A run's page in a real browser: paging through a long run, its timeline drawn, and the page
refreshing itself while another process moves the run, until the run ends.

Same browser as ``test_admin_browser`` (its ``pytestmark`` skips these too without chromium or
playwright). The run is moved by ``manage.py workflows`` in processes of their own while the
page stays open.
"""

from __future__ import annotations

import pytest

from pgbus_workflows.admin import run_page as admin_run_page
from tests.admin.test_admin_browser import browser_page, log_in, pytestmark  # noqa: F401 (pytestmark: the skips)
from tests.admin.test_admin_run_page import fill_run
from tests.management.test_cli import wid
from tests.management.test_cli_processes import finish, manage
from tests.support import VIEW, staff_user
from tests.testapp.workflows import Squares, ThreeSteps


def listed(page) -> list[str]:
    return page.eval_on_selector_all("#timeline tr.pgbus-step", "rows => rows.map(r => r.dataset.step)")


def drawn(page) -> list[str]:
    return page.eval_on_selector_all("svg.pgbus-timeline-chart g.pgbus-tl-attempt", "gs => gs.map(g => g.dataset.step)")


def test_an_operator_pages_through_a_long_run_s_attempts_each_drawn_as_a_bar(live_server, django_user_model):
    wf = Squares.start(count=3)
    fill_run(wf, attempts=60, events=30, signals=5)
    wf.cancel(actor="test", reason="a still page")  # nothing refreshes under the clicks
    steps = [str(pk) for pk in wf.record.steps.order_by("-pk").values_list("pk", flat=True)]
    staff_user(django_user_model, "petra", *VIEW)

    with browser_page(live_server) as page:
        log_in(page, live_server, "petra")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/{wf.record.pk}/change/")
        page.wait_for_selector("svg.pgbus-timeline-chart")
        assert listed(page) == drawn(page) == steps[:25]
        assert "1 to 25 of 61, newest first" in page.locator("#timeline .pgbus-pager").inner_text()
        # The solid part of an attempt's bar has its status badge's colour.
        fill = page.eval_on_selector("g.pgbus-s-completed rect.pgbus-tl-running", "r => getComputedStyle(r).fill")
        badge = page.eval_on_selector(
            "tr.pgbus-step-completed .pgbus-badge", "b => getComputedStyle(b).backgroundColor"
        )
        assert fill == badge, (fill, badge)
        assert page.eval_on_selector("g.pgbus-tl-attempt rect.pgbus-tl-running", "r => r.getBBox().width") >= 2

        page.click("#timeline a.pgbus-older")
        page.wait_for_url("**steps_page=2**")
        assert listed(page) == drawn(page) == steps[25:50]
        page.click("#timeline a.pgbus-older")
        page.wait_for_url("**steps_page=3**")
        assert listed(page) == drawn(page) == steps[50:]
        assert page.locator("#timeline a.pgbus-older").count() == 0
        assert "51 to 61 of 61" in page.locator("#timeline .pgbus-pager").inner_text()
        assert "1 to 25 of 32" in page.locator("#events .pgbus-pager").inner_text()  # its own page still
        page.click("#events a.pgbus-older")
        page.wait_for_url("**events_page=2**")
        assert "steps_page=3" in page.url and listed(page) == steps[50:]
        assert "26 to 32 of 32" in page.locator("#events .pgbus-pager").inner_text()
        page.click("#timeline a.pgbus-newer")
        page.wait_for_url("**steps_page=2**")
        assert listed(page) == steps[25:50]


def badge(page) -> str:
    return page.locator(".field-coloured_status .pgbus-badge").inner_text()


def test_the_page_follows_the_run_moved_by_another_process_and_stops_once_it_ends(
    live_server, django_user_model, monkeypatch
):
    monkeypatch.setattr(admin_run_page, "REFRESH_SECONDS", 1)
    wf = ThreeSteps.start()
    staff_user(django_user_model, "rita", *VIEW)
    run_url = f"{live_server.url}/admin/pgbus_workflows/workflowrun/{wf.record.pk}/change/"

    with browser_page(live_server) as page:
        log_in(page, live_server, "rita")
        page.goto(run_url)
        page.wait_for_selector("#pgbus-live")
        assert badge(page) == "ready"

        assert finish(manage("pause", wid(wf), "--reason", "from another process"))[0] == 0
        page.wait_for_selector(".field-coloured_status .pgbus-s-paused", timeout=10_000)
        page.wait_for_selector("#events tr.pgbus-event-paused")
        assert "from another process" in page.locator("#events tr.pgbus-event-paused").inner_text()

        # While the operator selects text, nothing moves under it.
        page.evaluate("window.getSelection().selectAllChildren(document.querySelector('#timeline h2'))")
        assert finish(manage("resume", wid(wf), "--reason", "carry on"))[0] == 0
        page.wait_for_timeout(3_000)
        assert badge(page) == "paused"
        page.evaluate("window.getSelection().removeAllRanges()")
        page.wait_for_selector(".field-coloured_status .pgbus-s-ready", timeout=10_000)

        assert finish(manage("cancel", wid(wf), "--reason", "not needed"))[0] == 0
        page.wait_for_selector(".field-coloured_status .pgbus-s-cancelled", timeout=10_000)
        # The page's sections are read just before its fields: a cancel committed in between
        # shows the new status with the live marker still on, and the next refresh removes it.
        page.wait_for_selector("#pgbus-live", state="detached", timeout=10_000)
        assert page.locator("#pgbus-operations a").count() == 0  # a viewer's page: no buttons, before or after
        fetched: list[str] = []
        page.on("request", lambda request: fetched.append(request.url))
        page.wait_for_timeout(3_000)
        assert fetched == []  # stopped: three seconds without a refresh

    assert wf.reload().status == "cancelled"


@pytest.mark.processes
def test_the_page_draws_each_attempt_a_dispatcher_runs_and_stops_when_the_run_finishes(
    live_server, django_user_model, monkeypatch, dispatchers
):
    monkeypatch.setattr(admin_run_page, "REFRESH_SECONDS", 1)
    wf = ThreeSteps.start()
    staff_user(django_user_model, "tess", *VIEW)

    with browser_page(live_server) as page:
        log_in(page, live_server, "tess")
        page.goto(f"{live_server.url}/admin/pgbus_workflows/workflowrun/{wf.record.pk}/change/")
        page.wait_for_selector("#pgbus-live")
        assert drawn(page) == listed(page) and len(listed(page)) == 1

        process = dispatchers("--once", settings={"POLL_INTERVAL": 0.2})
        assert process.wait() == 0, process.output()
        page.wait_for_selector(".field-coloured_status .pgbus-s-finished", timeout=10_000)
        # As with a cancel (above): a run that finished between the page's sections and its
        # fields shows finished with the live marker still on; the next refresh removes it.
        page.wait_for_selector("#pgbus-live", state="detached", timeout=10_000)
        assert len(drawn(page)) == 3 and drawn(page) == listed(page)
        assert page.locator("g.pgbus-tl-attempt.pgbus-s-completed").count() == 3
        fetched: list[str] = []
        page.on("request", lambda request: fetched.append(request.url))
        page.wait_for_timeout(3_000)
        assert fetched == []

    assert wf.reload().status == "finished"


def test_the_page_holds_still_while_a_field_has_the_focus_or_a_detail_is_open(
    live_server, django_user_model, monkeypatch
):
    from pgbus_workflows.testing import WorkflowTestMixin

    monkeypatch.setattr(admin_run_page, "REFRESH_SECONDS", 1)
    wf = ThreeSteps.start()
    WorkflowTestMixin().perform_next_step(wf)  # "one" completes with an output; the run goes on
    staff_user(django_user_model, "una", *VIEW)
    run_url = f"{live_server.url}/admin/pgbus_workflows/workflowrun/{wf.record.pk}/change/"

    with browser_page(live_server) as page:
        log_in(page, live_server, "una")
        page.goto(run_url)
        page.wait_for_selector("#pgbus-live")
        fetched: list[str] = []
        page.on("request", lambda request: fetched.append(request.url))

        def refreshes_while(hold: str, release: str) -> None:
            page.evaluate(hold)
            page.wait_for_timeout(500)  # a fetch sent just before the hold may still arrive
            fetched.clear()
            page.wait_for_timeout(2_500)
            assert fetched == [], hold
            page.evaluate(release)
            page.wait_for_timeout(2_500)
            assert run_url in fetched, release

        refreshes_while("document.querySelector('#nav-filter').focus()", "document.activeElement.blur()")
        refreshes_while(
            "document.querySelector('#timeline details.pgbus-output').open = true",
            "document.querySelector('#timeline details.pgbus-output').open = false",
        )
