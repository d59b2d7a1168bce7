"""The docs' one figure for a SIGKILLed dispatcher's recovery, derived from the settings that bound it.

The dead one's last heartbeat is up to one ``HEARTBEAT_INTERVAL`` old at the kill; it is told
dead once that heartbeat is ``session_grace()`` old and its lock free; a live dispatcher looks
at each of its heartbeats. So the attempt is stalled between the grace less one interval and
the grace plus one after the kill: the figure the README, the dispatcher guide, the
flow-control page and the comparison give for the default settings.
"""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from pgbus_workflows.conf import DEFAULTS
from pgbus_workflows.dispatcher.sweep import lost_sessions, session_grace
from pgbus_workflows.models import Dispatcher
from tests.procs import ROOT

PAGES = ("README.md", "docs/dispatcher.md", "docs/flow-control.md", "docs/explanation/comparison.md")


def _default_bounds() -> tuple[int, int]:
    with override_settings(PGBUS_WORKFLOWS={}):
        interval, grace = timedelta(seconds=DEFAULTS["HEARTBEAT_INTERVAL"]), session_grace()
    return int((grace - interval).total_seconds()), int((grace + interval).total_seconds())


@pytest.mark.parametrize("page", PAGES)
def test_each_page_gives_the_bounds_the_default_settings_make(page):
    low, high = _default_bounds()
    text = " ".join((ROOT / page).read_text().split())

    assert f"{low} to {high} s" in text
    for stale in ("within seconds", "about 30 s", "no longer than the stall threshold"):
        assert stale not in text


@pytest.mark.django_db(transaction=True)
def test_a_silent_dispatcher_whose_lock_is_free_is_told_dead_once_its_heartbeat_is_the_grace_old():
    with override_settings(PGBUS_WORKFLOWS={}):
        grace, now = session_grace(), timezone.now()
        Dispatcher.objects.create(name="killed", hostname="h", pid=1, heartbeat_at=now, session_lock=True)

        assert lost_sessions(now + grace - timedelta(seconds=1)) == []
        assert lost_sessions(now + grace + timedelta(seconds=1)) == ["killed"]
