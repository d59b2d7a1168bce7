"""One bad row costs only itself: the sweep's phases act on each row through :class:`RowFailures`.

A phase that stopped at its first exception would meet the same row first at every sweep, and
the rows behind it (other runs' wait timeouts, stalls) would never be served. Instead each row
is acted on alone: a row whose run another transaction holds is passed over (it is alive: an
``atomic=True`` body, an operator), and a row that fails is logged, recorded on its run (a
``sweep_failed`` event), and passed over by later sweeps for :data:`RETRY_AFTER` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..models import WorkflowEvent, WorkflowRun
from ..sql import clock
from .ledger import SYSTEM_ACTOR
from .locks import RunLocked
from .outcome import error_message
from .transactions import CONNECTION_ERRORS

logger = logging.getLogger("pgbus_workflows")

#: Seconds a row that failed is passed over before the sweep tries it again.
RETRY_AFTER = 600.0


class RowFailures:
    """The rows the sweep's phases failed on, and the guard each row's action runs in."""

    def __init__(self, retry_after: float = RETRY_AFTER) -> None:
        self.retry_after = retry_after
        self._until: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def passed_over(self, phase: str) -> list[int]:
        """The keys of the rows ``phase`` failed on recently (for its query to leave out)."""
        now = time.monotonic()
        with self._lock:
            for key in [key for key, until in self._until.items() if until <= now]:
                del self._until[key]
            return [pk for (name, pk) in self._until if name == phase]

    def act(self, phase: str, key: int, run_pk: int | None, action: Callable[[], object]) -> int:
        """Run one row's ``action``; 1 when it acted, 0 when it did not, was locked, or failed.

        A lost connection is raised (the whole phase retries next sweep); any other error is
        logged, recorded on the run, and the row passed over for :attr:`retry_after`.
        """
        try:
            return int(bool(action()))
        except (RunLocked, WorkflowRun.DoesNotExist):
            return 0  # alive (another transaction holds the run), or deleted since the query
        except CONNECTION_ERRORS:
            raise
        except Exception as error:
            logger.exception("Sweep phase %s failed on row %s (run %s); passing it over", phase, key, run_pk)
            with self._lock:
                self._until[(phase, key)] = time.monotonic() + self.retry_after
            if run_pk is not None:
                _record(phase, key, run_pk, error)
            return 0


def _record(phase: str, key: int, run_pk: int, error: Exception) -> None:
    """A ``sweep_failed`` event on the run: operators see why its timeout or stall did not fire."""
    try:
        WorkflowEvent.objects.create(
            run_id=run_pk,
            kind="sweep_failed",
            actor=SYSTEM_ACTOR,
            reason=f"{type(error).__name__}: {error_message(error)}"[:2000],
            details={"phase": phase, "row": key, "retry_after_seconds": RETRY_AFTER},
            created_at=clock.now(),
        )
    except Exception:
        logger.exception("Could not record the sweep failure on run %s", run_pk)
