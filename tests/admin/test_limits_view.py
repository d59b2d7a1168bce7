"""Limits an operator can read: each limiter links the steps it holds back; the run page links its limiters."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pgbus_workflows.models import WorkflowLimiter, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.limiters import held_back_by, held_back_steps
from pgbus_workflows.sql import clock
from tests.admin.test_admin_permissions import login, run_page_html
from tests.support import run_page, scheduled
from tests.testapp.limited_workflows import KeyedSleeper, RateLimited

pytestmark = pytest.mark.django_db

LIMITERS = "admin:pgbus_workflows_workflowlimiter_changelist"
STEPS = "admin:pgbus_workflows_workflowstep_changelist"
BUSY = "concurrency:account:busy"


@pytest.fixture
def busy():
    """Five runs of one account: the first's step in progress (the key's one slot), three parked by the
    claim, and one started after the claim (due, held back, not parked yet)."""
    runs = [KeyedSleeper.start(account="busy", seconds=0) for _ in range(4)]
    [claimed] = claim_due_steps(10, queues=["keyed"], claimed_by="test")
    assert claimed.run_id == runs[0].record.pk
    later = KeyedSleeper.start(account="busy", seconds=0)
    assert [scheduled(wf).parked for wf in [*runs[1:], later]] == [True, True, True, False]
    KeyedSleeper.start(account="other", seconds=0)  # a key with room: holds nothing back
    return runs, later


def _step_ids(html: str) -> set[int]:
    return {int(pk) for pk in re.findall(r'<th class="field-id"><a href="[^"]*">(\d+)</a>', html)}


def test_each_limiter_links_the_steps_it_holds_back_with_their_count(admin_client, busy):
    runs, later = busy
    html = admin_client.get(reverse(LIMITERS)).content.decode()

    link = f"{reverse(STEPS)}?held_back_by=concurrency%3Aaccount%3Abusy"
    assert f'<td class="field-held_back"><a href="{link}">4 steps</a></td>' in html  # 3 parked, 1 not yet
    other = f"{reverse(STEPS)}?held_back_by=concurrency%3Aaccount%3Aother"
    assert f'<td class="field-held_back"><a href="{other}">0 steps</a></td>' in html

    listed = admin_client.get(link).content.decode()
    assert _step_ids(listed) == {scheduled(wf).pk for wf in [*runs[1:], later]}  # not the one in progress
    assert "held back by" in listed and BUSY in listed  # the filter shows the limiter chosen


def test_a_keys_steps_are_no_longer_held_back_once_the_key_has_room(admin_client, busy):
    runs, _later = busy
    WorkflowLimiter.objects.filter(name=BUSY).update(in_use=0)  # the slot given back, nothing claimed yet

    listed = admin_client.get(reverse(STEPS), {"held_back_by": BUSY}).content.decode()

    # The parked ones wait for the next claim to put them back; the one not parked is free to be claimed.
    assert _step_ids(listed) == {scheduled(wf).pk for wf in runs[1:]}


def test_a_limiters_own_page_shows_its_room_and_links_its_held_back_steps(admin_client, busy):
    url = reverse("admin:pgbus_workflows_workflowlimiter_change", args=[BUSY])

    html = admin_client.get(url).content.decode()

    assert "1 of 1 in use" in html
    assert f'<a href="{reverse(STEPS)}?held_back_by=concurrency%3Aaccount%3Abusy">4 steps</a>' in html


def test_the_run_page_links_the_limiters_of_its_active_step_to_the_list_filtered_to_each(admin_client, busy):
    runs, _later = busy
    WorkflowLimiter.objects.create(name="concurrency:account:busy2", kind="concurrency", limit=1)

    html = admin_client.get(run_page(runs[1])).content.decode()

    section = html.split('id="limiters"', 1)[1].split("</table>", 1)[0]
    assert "Limits of step work" in section
    filtered = f"{reverse(LIMITERS)}?name=concurrency%3Aaccount%3Abusy"
    assert f'<a href="{filtered}">{BUSY}</a>' in section
    assert "<td>1 of 1 in use</td>" in section and ">4 steps</a>" in section

    listed = admin_client.get(filtered).content.decode()
    assert re.findall(r'<th class="field-limiter_name"><a href="[^"]*">([^<]+)</a>', listed) == [BUSY]


def test_a_run_whose_step_is_under_no_limit_has_no_limits_section(admin_client, busy):
    runs, _later = busy
    WorkflowStep.objects.filter(run_id=runs[1].record.pk).update(limiters=None)

    assert 'id="limiters"' not in admin_client.get(run_page(runs[1])).content.decode()


def test_the_run_page_shows_its_limiters_only_with_the_permission_to_view_limiters(client, django_user_model, busy):
    runs, _later = busy
    login(client, django_user_model, "view_workflowrun")
    assert 'id="limiters"' not in run_page_html(client, runs[1])

    login(client, django_user_model, "view_workflowrun", "view_workflowlimiter", name="carol")
    assert 'id="limiters"' in run_page_html(client, runs[1])


def test_a_rate_limit_with_no_token_holds_back_its_due_steps(admin_client):
    runs = [RateLimited.start() for _ in range(2)]
    empty = {"tokens": 0.0, "refilled_at": clock.now(), "per": timedelta(hours=1)}  # the next token in 12 minutes
    WorkflowLimiter.objects.filter(name="rate:proc-rate").update(**empty)

    html = admin_client.get(reverse(LIMITERS), {"kind": "rate"}).content.decode()
    assert re.search(r'<td class="field-room">0 of 5 tokens, next in 1[12] min \d+ s</td>', html), html
    assert ">2 steps</a>" in html

    listed = admin_client.get(reverse(STEPS), {"held_back_by": "rate:proc-rate"}).content.decode()
    assert _step_ids(listed) == {scheduled(wf).pk for wf in runs}


def test_the_held_back_counts_and_the_filter_read_the_parked_index(admin_client, busy):
    page = list(WorkflowLimiter.objects.filter(name=BUSY))
    with CaptureQueriesContext(connection) as captured:
        assert held_back_by(page, clock.now()) == {BUSY: 4}
    [counted] = [q["sql"] for q in captured.captured_queries if "parked_on" in q["sql"] and "COUNT" in q["sql"]]
    assert "pgbus_wf_step_parked" in _plan(counted, None)

    full = WorkflowStep.objects.filter(held_back_steps(BUSY, clock.now())).values("pk")
    assert "pgbus_wf_step_parked" in _plan(*full.query.sql_with_params())
    WorkflowLimiter.objects.filter(name=BUSY).update(in_use=0)  # room: the parked steps alone
    with_room = WorkflowStep.objects.filter(held_back_steps(BUSY, clock.now())).values("pk")
    assert "pgbus_wf_step_parked" in _plan(*with_room.query.sql_with_params())


def _plan(sql: str, params) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())
