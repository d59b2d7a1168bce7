"""Which dispatcher claims at once when a NOTIFY comes: the first of its group; the others follow later.

Every dispatcher LISTENs on the same channel, so every NOTIFY (a run started, a signal, a
resume) reaches all of them. Were they all to claim at once, one would get the step and each
other would pay a claim for nothing, and a trickle of runs would be spread thin over all of
them, each batching fewer outcomes per transaction than one would. So within a group
(dispatchers serving the same queues with the same code, hence the same catalog) the first
by name claims at once, and the others claim :data:`FOLLOW_MIN` later, a delay that doubles
(up to :data:`FOLLOW_MAX`) while their claims find nothing and falls back as soon as one finds
work. What the first cannot take (its worker slots are full, or it died) is taken by a
follower within its delay. Groups are elected from the ``Dispatcher`` rows at every
heartbeat, and at once when a dispatcher joins or leaves (it announces itself on
:func:`dispatchers_channel`).
"""

from __future__ import annotations

import logging

from .. import sql
from ..conf import settings
from ..dsl.deploy import catalog
from ..models import Dispatcher
from ..sql import clock

logger = logging.getLogger("pgbus_workflows")

#: A follower's shortest wait after a NOTIFY before it claims (seconds).
FOLLOW_MIN = 0.02
#: Its longest, reached while its claims keep finding nothing (the first keeps up).
FOLLOW_MAX = 1.0


def dispatchers_channel() -> str:
    """The channel on which a dispatcher announces that it joined or left (payload: its name)."""
    return f"{settings.NOTIFY_CHANNEL}_dispatchers"


class Wakeups:
    """One dispatcher's place in its group: whether it claims at once after a NOTIFY, or how much later."""

    def __init__(self, name: str, queues: frozenset[str] | None) -> None:
        self.name = name
        #: As the ``Dispatcher`` row stores them.
        self.queues = sorted(queues) if queues else []
        #: First of its group until an election says otherwise.
        self.first = True
        self._elected = False
        self.delay = FOLLOW_MIN

    def elect(self) -> None:
        """Find out whether this dispatcher is now the first of its group (one query).

        Its group: live dispatchers (a heartbeat within ``DISPATCHER_DEAD_AFTER``) with
        worker threads, serving the same queues with the same catalog. The first is the
        smallest name; with none (this one's row is not written yet), this one.
        """
        live_since = clock.now() - settings.DISPATCHER_DEAD_AFTER
        group = Dispatcher.objects.filter(
            heartbeat_at__gte=live_since, workers_alive__gt=0, queues=self.queues, catalog=catalog()
        )
        first = group.order_by("name").values_list("name", flat=True).first()
        was, self.first = self.first, first is None or first == self.name
        if self.first:
            self.delay = FOLLOW_MIN
        if self.first != was or not self._elected:
            self._elected = True
            if self.first:
                logger.info("Dispatcher %s now claims at once (the first of its group)", self.name)
            else:
                logger.info("Dispatcher %s now follows %s (claims what waited for it)", self.name, first)

    def claimed(self, count: int) -> None:
        """What a claim took: a follower's delay falls back once it finds work, and grows while it finds none."""
        if not self.first:
            self.delay = FOLLOW_MIN if count else min(self.delay * 2, FOLLOW_MAX)

    def deferral(self) -> float:
        """Seconds to wait after a NOTIFY (or a step's due time) before claiming: 0 for the first of the group."""
        return 0.0 if self.first else self.delay


def announce(name: str) -> None:
    """Tell the other dispatchers that ``name`` joined or left: they elect again (PostgreSQL)."""
    if sql.postgresql():
        with sql.cursor() as cursor:
            cursor.execute(sql.statement("notify"), [dispatchers_channel(), name])
