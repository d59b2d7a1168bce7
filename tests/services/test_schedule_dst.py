"""Cron schedules keep their local time across daylight-saving changes (a 02:30 daily in Europe/Paris).

On 2025-03-30 Paris skips 02:00-03:00: the 02:30 tick fires once, at 03:00 local (01:00 UTC).
On 2025-10-26 Paris repeats 02:00-03:00: the 02:30 tick fires once, the first time (00:30 UTC).
Every other day it fires at 02:30 local: 01:30 UTC in winter, 00:30 UTC in summer.
"""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pgbus_workflows.testing import tick_schedules
from tests.testapp.workflows import Ticked

pytestmark = pytest.mark.django_db

PARIS = ZoneInfo("Europe/Paris")


def utc(*args):
    return datetime(*args, tzinfo=UTC)


SPRING = [utc(2025, 3, 29, 1, 30), utc(2025, 3, 30, 1, 0), utc(2025, 3, 31, 0, 30), utc(2025, 4, 1, 0, 30)]
AUTUMN = [utc(2025, 10, 25, 0, 30), utc(2025, 10, 26, 0, 30), utc(2025, 10, 27, 1, 30), utc(2025, 10, 28, 1, 30)]


@pytest.mark.parametrize("expected", [SPRING, AUTUMN], ids=["spring_forward", "fall_back"])
def test_a_0230_paris_schedule_fires_once_a_day_across_the_change_when_catching_up(expected):
    start = expected[0] - timedelta(hours=12)
    Ticked.add_schedule(cron="30 2 * * *", timezone="Europe/Paris", start_at=start, catchup="all", overlap="allow")

    runs = tick_schedules(now=expected[-1] + timedelta(hours=1))

    assert [wf.scheduled_for for wf in runs] == expected
    local_days = [wf.scheduled_for.astimezone(PARIS).date() for wf in runs]
    assert len(set(local_days)) == len(local_days) == 4


@pytest.mark.parametrize("expected", [SPRING, AUTUMN], ids=["spring_forward", "fall_back"])
def test_a_leader_ticking_every_ten_minutes_through_the_change_fires_each_day_once(expected):
    start = expected[0] - timedelta(hours=12)
    Ticked.add_schedule(cron="30 2 * * *", timezone="Europe/Paris", start_at=start, overlap="allow")

    fired = []  # (the round's time, the run it started)
    now = start
    while now <= expected[-1] + timedelta(hours=1):
        fired.extend((now, wf) for wf in tick_schedules(now=now))
        now += timedelta(minutes=10)

    assert [wf.scheduled_for for _, wf in fired] == expected
    # Each tick fired in the first round at or after its time, never before it.
    assert all(timedelta(0) <= at - wf.scheduled_for < timedelta(minutes=10) for at, wf in fired)
