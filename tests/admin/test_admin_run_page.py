"""A run's admin page on a run of any size: paged sections, the same queries, the timeline drawn.

A big run is a real run given a long history in SQL (``fill_run``): 200 finished attempts, 20 of
them fan-outs with three jobs each, 500 events and 60 signals, as a webhook-fed run collects.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.messages.constants import WARNING
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pgbus_workflows import OnException, Workflow, sql, step
from pgbus_workflows.admin.run_chart import attempt_parts
from pgbus_workflows.admin.run_page import PAGE_ROWS, REFRESH_SECONDS
from pgbus_workflows.models import WorkflowEvent, WorkflowSignal, WorkflowStep
from pgbus_workflows.testing import WorkflowTestMixin
from tests.support import VIEW, messages_of, run_page, staff_user
from tests.testapp.workflows import Squares

pytestmark = pytest.mark.django_db

helpers = WorkflowTestMixin()

ATTEMPTS, FAN_OUTS, EVENTS, SIGNALS = 200, 20, 500, 60

#: Old attempts of the run's fan-out step, a minute apart, every tenth a fan-out of three jobs.
FILL = [
    """INSERT INTO pgbus_workflows_workflowstep (run_id, step_name, attempt, status, outcome, reattempt_reason,
         queue, priority, scheduled_at, started_at, finished_at, claimed_by, error_class, error_message, traceback,
         timed_out, created_at, fan_out_total)
       SELECT %(run)s, 'compute', n, 'completed', 'reattempted', 'flow_control', 'workflows', 0, t,
              t + interval '1 second', t + interval '3 seconds', 'test', '', '', '', false, t - interval '10 seconds',
              CASE WHEN n %% 10 = 0 THEN 3 END
       FROM (SELECT n, now() - interval '1 minute' * (%(attempts)s + 1 - n) AS t
             FROM generate_series(1, %(attempts)s) AS n) AS history""",
    """INSERT INTO pgbus_workflows_fanoutjob (step_id, run_id, index, function, arguments, status, attempts,
         max_attempts, stalls, queue, priority, scheduled_at, claimed_by, error)
       SELECT s.id, s.run_id, i, 'tests.testapp.jobs.square', '{}',
              CASE i WHEN 0 THEN 'succeeded' WHEN 1 THEN 'failed' ELSE 'running' END,
              1, 1, 0, 'workflows', 0, now(), '', ''
       FROM pgbus_workflows_workflowstep AS s, generate_series(0, 2) AS i
       WHERE s.run_id = %(run)s AND s.fan_out_total IS NOT NULL""",
    """INSERT INTO pgbus_workflows_workflowevent (run_id, kind, transition, from_status, to_status, actor, reason,
         details, created_at)
       SELECT %(run)s, 'webhook_seen', '', '', '', 'webhook', '', jsonb_build_object('n', n), now()
       FROM generate_series(1, %(events)s) AS n""",
    """INSERT INTO pgbus_workflows_workflowsignal (run_id, name, payload, status, actor, reason, received_at)
       SELECT %(run)s, 'ping', jsonb_build_object('n', n), 'consumed', 'webhook', '', now()
       FROM generate_series(1, %(signals)s) AS n""",
]


def fill_run(wf: Workflow, attempts: int = ATTEMPTS, events: int = EVENTS, signals: int = SIGNALS) -> None:
    """Give the run a long history: ``attempts`` finished attempts (a tenth fan-outs), events and signals."""
    params = {"run": wf.record.pk, "attempts": attempts, "events": events, "signals": signals}
    with connection.cursor() as cursor:
        for statement in FILL:
            cursor.execute(statement, params)


class PageThree(Workflow):
    name = "page_three"

    @step
    def a(self):
        return {"a": 1}

    @step
    def b(self):
        pass

    @step
    def c(self):
        pass


class PageWaits(Workflow):
    name = "page_waits"

    @step(wait=timedelta(hours=1))
    def later(self):
        pass

    @step(wait_for="approved")
    def approve(self):
        pass


class CarrierBusy(ConnectionError):
    """The carrier's API asked us to come back later."""


class PageBacksOff(Workflow):
    """Its step fails once and is reattempted a minute later."""

    name = "page_backs_off"
    exception_policies = [OnException(CarrierBusy, action="reattempt", wait=timedelta(minutes=1))]

    @step
    def book(self):
        if self.attempt == 1:
            raise CarrierBusy("try again in a minute")


@pytest.fixture
def operator_client(client, django_user_model):
    client.force_login(staff_user(django_user_model, "olga", *VIEW, "pause_workflowrun", "cancel_workflowrun"))
    return client


def step_ids(html: str) -> list[int]:
    """The attempts listed in the timeline's table, in their order."""
    return [int(pk) for pk in re.findall(r'<tr class="pgbus-step [^"]*" data-step="(\d+)"', html)]


def bars(html: str) -> list[int]:
    """The attempts drawn in the timeline's picture, in their order."""
    return [int(pk) for pk in re.findall(r'<g class="pgbus-tl-attempt [^"]*" data-step="(\d+)"', html)]


def newest_first(model, wf, offset: int = 0) -> list[int]:
    pks = model.objects.filter(run_id=wf.record.pk).order_by("-pk").values_list("pk", flat=True)
    return list(pks[offset : offset + PAGE_ROWS])


def queries_of(client, url: str) -> tuple[str, list[str]]:
    """The page and its queries, but for a reading of the database's clock (one every 30 s, whatever the page)."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    queries = [query["sql"] for query in captured.captured_queries]
    return response.content.decode(), [text for text in queries if text != sql.statement("database_clock")]


def test_the_run_page_sends_the_same_queries_for_three_steps_as_for_a_long_history(operator_client):
    small = PageThree.start()
    helpers.speedrun_workflow(small)
    big = Squares.start(count=3)
    fill_run(big)
    assert WorkflowStep.objects.filter(run_id=big.record.pk, fan_out_total__isnull=False).count() == FAN_OUTS

    operator_client.get(run_page(small))  # the session and permission caches warm up once
    small_html, small_queries = queries_of(operator_client, run_page(small))
    big_html, big_queries = queries_of(operator_client, run_page(big))

    assert len(big_queries) == len(small_queries), "\n".join(big_queries)
    assert len(step_ids(small_html)) == 3
    assert step_ids(big_html) == newest_first(WorkflowStep, big)  # the newest 25 of 201
    assert big_html.count('<tr class="pgbus-event ') == PAGE_ROWS
    assert big_html.count('<tr class="pgbus-signal">') == PAGE_ROWS
    # The fan-out progress of the page's three fan-outs (attempts 200, 190, 180), from one grouped query.
    assert big_html.count("fan-out: 1 done / 1 failed / 3 jobs") == 3
    assert sum("pgbus_workflows_fanoutjob" in sql for sql in big_queries) == 1
    # The counts, taken within the run.
    for shown in ("1 to 25 of 201, newest first", f"1 to 25 of {EVENTS + 1}, newest first", f"1 to 25 of {SIGNALS}"):
        assert shown in big_html, shown
    assert "1 to 3 of 3, newest first" in small_html


def test_each_section_pages_back_in_time_keeping_the_others_page(operator_client):
    wf = Squares.start(count=3)
    fill_run(wf)
    html = operator_client.get(run_page(wf), {"steps_page": 2, "events_page": 3}).content.decode()

    assert step_ids(html) == newest_first(WorkflowStep, wf, offset=PAGE_ROWS)
    assert bars(html) == step_ids(html)  # one bar per attempt listed, in the table's order
    events = [int(pk) for pk in re.findall(r'href="/admin/pgbus_workflows/workflowevent/(\d+)/change/"', html)]
    assert events == newest_first(WorkflowEvent, wf, offset=2 * PAGE_ROWS)
    assert "26 to 50 of 201, newest first" in html and "page 2 of 9" in html
    assert '<a class="pgbus-older" href="?steps_page=3&amp;events_page=3#timeline">' in html
    assert '<a class="pgbus-newer" href="?events_page=3#timeline">' in html
    assert '<a class="pgbus-newer" href="?steps_page=2&amp;events_page=2#events">' in html
    assert '<a class="pgbus-older" href="?steps_page=2&amp;events_page=3&amp;signals_page=2#signals">' in html

    last = operator_client.get(run_page(wf), {"signals_page": 3}).content.decode()
    signals = [int(pk) for pk in re.findall(r'href="/admin/pgbus_workflows/workflowsignal/(\d+)/change/"', last)]
    assert signals == newest_first(WorkflowSignal, wf, offset=2 * PAGE_ROWS) and len(signals) == SIGNALS - 50
    assert "51 to 60 of 60, newest first" in last and '<span class="pgbus-muted">older &rsaquo;</span>' in last


@pytest.mark.parametrize(
    ("asked", "shown", "message"),
    [
        ("abc", 1, "There is no page “abc” of attempts: page 1 of 9 is shown."),
        ("0", 1, "There is no page “0” of attempts: page 1 of 9 is shown."),
        ("99", 9, "There is no page “99” of attempts: page 9 of 9 is shown."),
    ],
)
def test_a_page_that_does_not_exist_shows_the_nearest_with_a_warning(operator_client, asked, shown, message):
    wf = Squares.start(count=3)
    fill_run(wf)
    response = operator_client.get(run_page(wf), {"steps_page": asked})
    assert response.status_code == 200
    assert (WARNING, message) in messages_of(response)
    assert step_ids(response.content.decode()) == newest_first(WorkflowStep, wf, offset=(shown - 1) * PAGE_ROWS)


def test_each_attempt_is_one_row_with_its_traceback_and_output_behind_details(operator_client):
    from tests.admin.test_admin import AdminFlaky
    from tests.testapp.models import Order

    wf = AdminFlaky.start(Order.objects.create())
    helpers.perform_next_step(wf)  # fails: paused on error
    wf.resume(actor="carol", reason="fixed")
    helpers.perform_next_step(wf)
    html = operator_client.get(run_page(wf)).content.decode()
    table = html[html.index('<table class="pgbus-table pgbus-attempts">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r'<tr class="pgbus-step .*?</tr>', table, re.S)
    assert len(rows) == 3  # after #1, boom #2, boom #1: newest first
    failed = rows[-1]
    assert "<details><summary>Traceback</summary>" in failed and "raise Boom" in failed
    assert "first attempt fails" in failed and "<dl>" not in failed
    assert 'class="pgbus-output"' not in failed  # no output, no detail for it
    assert re.search(r'<td class="pgbus-time">\d+\.\d s</td>', rows[1])  # boom #2's duration
    assert "due" in rows[0] and "pgbus-s-scheduled" in rows[0]  # after: not started yet


def test_the_parts_of_an_attempt_show_its_delay_its_wait_and_its_runs():
    wf = PageWaits.start()
    now = timezone.now()
    [later] = WorkflowStep.objects.filter(run_id=wf.record.pk)
    assert [kind for kind, *_ in attempt_parts(later, now)] == ["delayed"]  # due in an hour, not yet
    assert attempt_parts(later, now)[0][2] == later.scheduled_at

    helpers.perform_next_step(wf)  # "later" runs (the helper does not wait the hour)
    helpers.perform_next_step(wf)  # "approve" finds no signal: parked
    parked = WorkflowStep.objects.get(run_id=wf.record.pk, step_name="approve")
    assert [kind for kind, *_ in attempt_parts(parked, timezone.now())] == ["queued", "running", "parked"]

    helpers.deliver_signal(wf, "approved", {"ok": True})
    woken = WorkflowStep.objects.get(pk=parked.pk)
    parts = attempt_parts(woken, timezone.now())
    assert [kind for kind, *_ in parts] == ["queued", "parked", "queued", "running"]
    assert all(start <= end for _kind, start, end in parts)
    assert [start for _kind, start, _end in parts] == sorted(start for _kind, start, _end in parts)


def test_a_reattempt_is_delayed_by_its_backoff_after_the_failed_attempt():
    wf = PageBacksOff.start()
    helpers.perform_next_step(wf)
    failed, again = WorkflowStep.objects.filter(run_id=wf.record.pk).order_by("pk")
    assert (failed.status, again.attempt) == ("failed", 2)
    now = timezone.now()
    [(kind, start, end)] = attempt_parts(again, now)
    assert kind == "delayed" and end == again.scheduled_at and end - start >= timedelta(seconds=59)
    assert start >= failed.finished_at - timedelta(seconds=1)  # the gap after the failure is the backoff


def test_the_page_of_an_ongoing_run_refreshes_itself_every_5_seconds_and_a_finished_ones_does_not(operator_client):
    ongoing = PageWaits.start()
    html = operator_client.get(run_page(ongoing)).content.decode()
    assert REFRESH_SECONDS == 5  # docs/operating.md says so
    assert 'id="pgbus-live" class="pgbus-muted" data-seconds="5"' in html
    assert 'src="/static/pgbus_workflows/run_page.js"' in html

    ongoing.cancel(actor="olga", reason="not needed")
    html = operator_client.get(run_page(ongoing)).content.decode()
    assert 'id="pgbus-live"' not in html and 'id="pgbus-run-sections"' in html
    done = PageThree.start()
    helpers.speedrun_workflow(done)
    assert 'id="pgbus-live"' not in operator_client.get(run_page(done)).content.decode()


def test_the_script_and_stylesheet_are_static_files_of_the_app():
    from django.contrib.staticfiles import finders

    script = finders.find("pgbus_workflows/run_page.js")
    assert script and "pgbus-live" in Path(script).read_text()
    assert finders.find("pgbus_workflows/run_page.css")
