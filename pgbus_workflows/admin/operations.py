"""The operations of the operator console: the registry of verbs the admin offers.

``OPERATIONS`` lists every verb with its permission, labels and form. ``allowed_verbs()``
asks ``states.allowed_verbs`` which ones a run's state allows, for showing buttons only:
the verb itself decides, under the run's lock. ``perform()`` calls the same public verbs
user code calls (``services.operator``, ``services.signals``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.translation import gettext_lazy as _

from .. import states
from ..models import WorkflowRun, WorkflowStep
from ..services import operator
from ..services.signals import deliver_signal
from .forms import ReasonForm, ResumeAtForm, SignalForm

if TYPE_CHECKING:
    from django.utils.functional import _StrOrPromise


@dataclass(frozen=True)
class Operation:
    """One operator verb as the admin offers it."""

    verb: str  # the function in the services, and the last part of its URL
    permission: str  # "pause" -> has_pause_permission() and pgbus_workflows.pause_workflowrun
    label: _StrOrPromise  # the button
    done: _StrOrPromise  # "paused" in "3 paused"
    form_class: type[ReasonForm] = ReasonForm


OPERATIONS: dict[str, Operation] = {
    op.verb: op
    for op in (
        Operation("pause", "pause", _("Pause"), _("paused")),
        Operation("resume", "pause", _("Resume"), _("resumed")),
        Operation("resume_at", "skip", _("Resume at a step"), _("resumed"), ResumeAtForm),
        Operation("run_now", "run_now", _("Run now"), _("made due now")),
        Operation("skip", "skip", _("Skip the current step"), _("moved past the current step")),
        Operation("signal", "signal", _("Deliver a signal"), _("signalled"), SignalForm),
        Operation("cancel", "cancel", _("Cancel"), _("cancelled")),
        Operation("rerun", "rerun", _("Rerun"), _("rerun")),
    )
}


def allowed_verbs(run: WorkflowRun, active: WorkflowStep | None, now: datetime) -> frozenset[str]:
    """The verbs the run's state allows (``states.allowed_verbs``), for showing buttons only."""
    return states.allowed_verbs(operator.run_facts(run, active, now))


def perform(op: Operation, run_pk: int, data: dict[str, Any], actor: str) -> Any:
    """Call the public verb behind ``op``; raises what the verb raises, having changed nothing."""
    reason = data.get("reason") or None
    if op.verb == "resume_at":
        return operator.resume_at(run_pk, data["step"], actor=actor, reason=reason)
    if op.verb == "signal":
        return deliver_signal(
            run_pk,
            data["name"],
            payload=data["payload"],
            idempotency_key=data["idempotency_key"],
            actor=actor,
            reason=reason,
        )
    return getattr(operator, op.verb)(run_pk, actor=actor, reason=reason)
