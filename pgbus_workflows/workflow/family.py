"""A run's family and its answer, on the handle: ``wf.parent``, ``wf.children``, ``wf.result()``."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..exceptions import WorkflowCancelled
from ..states import RunStatus

if TYPE_CHECKING:
    from ..models import WorkflowRun


class RunFamily:
    """The parent, the children and the result of a run (the ``RunFamily`` half of ``Workflow``)."""

    record: WorkflowRun

    def result(self, timeout: float | timedelta | None = None) -> Any:
        """Wait for the run to end (without busy polling) and return its result; any process may call it.

        The result is the output of the run's last completed step (what ``self.finished(result)``
        passed, when a step finished the run that way). Raises :class:`WorkflowCancelled` for a
        cancelled run and ``TimeoutError`` when ``timeout`` (seconds or a ``timedelta``) passes first,
        even while another transaction holds the run's row. A ``timeout`` that is not a finite
        duration >= 0 (NaN, infinity, negative, a bool) raises ``ValueError``; None waits for ever.
        """
        from ..services.lineage import run_result  # deferred: this module loads before the app registry
        from ..services.results import wait_for_end  # deferred: this module loads before the app registry

        self.record = wait_for_end(self.record, timeout)
        if self.record.status == RunStatus.CANCELLED:
            raise WorkflowCancelled(
                f"Run {self.record.workflow_id} ({self.record.workflow_class}) was cancelled", workflow=self
            )
        return run_result(self.record)
