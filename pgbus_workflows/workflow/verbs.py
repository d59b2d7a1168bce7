"""The operator verbs of a run's handle: the ``RunVerbs`` half of ``Workflow``.

Each takes ``actor=`` and ``reason=``, goes through ``services.operator`` (the verbs the admin
and ``manage.py workflows`` call, each admitted by ``states.allowed_verbs`` under the run's
lock) and writes an event. Inside a step body, ``pause``, ``cancel`` and ``skip`` end the body
instead (the executor applies them with the outcome).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from .body import FlowControl, StepBody

if TYPE_CHECKING:
    from ..models import WorkflowRun, WorkflowSignal


class RunVerbs(StepBody):
    """What an operator (or code) may do to a run through its handle."""

    _outputs: dict[str, Any] | None

    def reload(self) -> Self:
        """Re-read the run's row; returns self."""
        self.record.refresh_from_db()
        self._outputs = None
        return self

    def pause(self, reason: str | None = None, *, actor: str | None = None) -> Self:
        """Pause the run (in a step body: end the body and pause the run)."""
        if self._context is not None:
            raise FlowControl("pause", reason=reason)
        from ..services import operator  # deferred: this module loads before the app registry

        return self._after(operator.pause(self.record.pk, actor=actor, reason=reason))

    def cancel(self, reason: str | None = None, *, actor: str | None = None) -> Self:
        """Cancel the run (in a step body: end the body and cancel the run)."""
        if self._context is not None:
            raise FlowControl("cancel", reason=reason)
        from ..services import operator  # deferred: this module loads before the app registry

        return self._after(operator.cancel(self.record.pk, actor=actor, reason=reason))

    def skip(self, reason: str | None = None, *, actor: str | None = None) -> Self:
        """Skip the current step (in a step body: end the body, skip this step)."""
        if self._context is not None:
            raise FlowControl("skip", reason=reason)
        from ..services import operator  # deferred: this module loads before the app registry

        return self._after(operator.skip(self.record.pk, actor=actor, reason=reason))

    def resume(self, *, actor: str | None = None, reason: str | None = None) -> Self:
        """Resume a paused run where it stopped."""
        from ..services import operator  # deferred: this module loads before the app registry

        return self._after(operator.resume(self.record.pk, actor=actor, reason=reason))

    def resume_at(self, step_name: str, *, actor: str | None = None, reason: str | None = None) -> Self:
        """Resume a paused run at ``step_name`` (run now)."""
        from ..services import operator  # deferred: this module loads before the app registry

        return self._after(operator.resume_at(self.record.pk, step_name, actor=actor, reason=reason))

    def run_now(self, *, actor: str | None = None, reason: str | None = None) -> Self:
        """Make the run's scheduled step due now, whatever its ``wait``."""
        from ..services import operator  # deferred: this module loads before the app registry

        return self._after(operator.run_now(self.record.pk, actor=actor, reason=reason))

    def signal(
        self,
        name: str,
        payload: Any = None,
        idempotency_key: str | None = None,
        *,
        actor: str | None = None,
        reason: str | None = None,
    ) -> WorkflowSignal:
        """Deliver a signal to this run; returns the ``WorkflowSignal`` (``.duplicate_delivery``)."""
        from ..services.signals import deliver_signal  # deferred: this module loads before the app registry

        signal = deliver_signal(self.record.pk, name, payload, idempotency_key, actor=actor, reason=reason)
        self.reload()
        return signal

    def _after(self, record: WorkflowRun) -> Self:
        self.record = record
        self._outputs = None
        return self
