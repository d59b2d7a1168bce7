"""The admin's list of limiters: keys in natural order, each key's room counted as the list is read."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from pgbus_workflows.models import WorkflowLimiter
from pgbus_workflows.sql import clock

pytestmark = pytest.mark.django_db

URL = "admin:pgbus_workflows_workflowlimiter_changelist"


def _names_listed(html: str) -> list[str]:
    return re.findall(r'<th class="field-limiter_name"><a href="[^"]*">([^<]+)</a>', html)


def test_the_list_sorts_the_numbers_in_keys_by_value(admin_client):
    for n in (10, 2, 1, 100, 20):
        WorkflowLimiter.objects.create(name=f"concurrency:account:{n}", kind="concurrency", limit=1)
    WorkflowLimiter.objects.create(name="concurrency:zone:3", kind="concurrency", limit=1)

    listed = _names_listed(admin_client.get(reverse(URL)).content.decode())

    assert listed == [f"concurrency:account:{n}" for n in (1, 2, 10, 20, 100)] + ["concurrency:zone:3"]


def test_the_name_header_sorts_naturally_both_ways(admin_client):
    for n in (10, 2, 1):
        WorkflowLimiter.objects.create(name=f"concurrency:account:{n}", kind="concurrency", limit=1)

    listed = _names_listed(admin_client.get(reverse(URL), {"o": "-0"}).content.decode())

    assert listed == [f"concurrency:account:{n}" for n in (10, 2, 1)]


def test_the_natural_order_is_read_off_its_index(admin_client):
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {WorkflowLimiter._meta.db_table} (name, kind, "limit", in_use, created_at) '
            "SELECT 'concurrency:account:' || n, 'concurrency', 1, 0, now() FROM generate_series(1, 20000) n"
        )
        cursor.execute(f"ANALYZE {WorkflowLimiter._meta.db_table}")
    with CaptureQueriesContext(connection) as captured:
        html = admin_client.get(reverse(URL)).content.decode()
    assert _names_listed(html)[:3] == ["concurrency:account:1", "concurrency:account:2", "concurrency:account:3"]

    table = WorkflowLimiter._meta.db_table
    sent = [q["sql"] for q in captured.captured_queries if table in q["sql"] and q["sql"].startswith("SELECT")]
    assert sent and not [sql for sql in sent if "DISTINCT" in sql.upper()]  # the kind filter lists no values
    for sql in sent:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "Seq Scan" not in plan, (sql, plan)
        assert "ORDER BY" not in sql or "pgbus_wf_limiter_natural" in plan, (sql, plan)


def test_a_rate_limits_tokens_are_counted_as_the_list_is_read_not_as_stored(admin_client):
    now = clock.now()
    WorkflowLimiter.objects.create(
        name="rate:crm",
        kind="rate",
        limit=5,
        per=timedelta(hours=1),
        tokens=0.0,
        refilled_at=now - timedelta(minutes=30),
    )
    WorkflowLimiter.objects.create(
        name="rate:full", kind="rate", limit=5, per=timedelta(hours=1), tokens=1.0, refilled_at=now - timedelta(hours=2)
    )
    WorkflowLimiter.objects.create(name="concurrency:account:7", kind="concurrency", limit=3, in_use=2)

    html = admin_client.get(reverse(URL)).content.decode()

    # 0 stored half an hour ago, 5 an hour: 2.5 now, the third whole token in 6 minutes.
    assert re.search(r'<td class="field-room">2 of 5 tokens, next in (6 min 0 s|5 min 59 s)</td>', html), html
    assert '<td class="field-room">5 of 5 tokens</td>' in html
    assert '<td class="field-room">2 of 3 in use</td>' in html
