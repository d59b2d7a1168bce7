"""The operations of the operator console and their forms.

``OPERATIONS`` lists every verb the admin offers, with its permission, labels and form (a
reason for every verb, plus what some verbs need). ``allowed_verbs()`` says which ones a
run's state allows, for showing buttons only: the verb itself decides, under the run's
lock. ``perform()`` calls the same public verbs user code calls (``services.operator``,
``services.signals``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.utils.translation import gettext_lazy as _

from . import states
from .exceptions import PayloadNotSerializable, PayloadTooLarge
from .models import WorkflowRun, WorkflowStep
from .registry import registry
from .services import operator
from .services.payload import encode_payload
from .services.signals import deliver_signal
from .states import ACTIVE_STEP

if TYPE_CHECKING:
    from django.utils.functional import _StrOrPromise


class ReasonForm(forms.Form):
    """Why the operator acts: recorded on the audit event the verb writes."""

    reason = forms.CharField(
        label=_("Reason"),
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_("Recorded in the run's audit trail with your username."),
    )

    def __init__(self, *args: Any, run: WorkflowRun | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run = run


class ResumeAtForm(ReasonForm):
    """Resume a paused run at one of its class's steps."""

    step = forms.ChoiceField(label=_("Step"), help_text=_("The run goes on at this step, now."))
    field_order = ["step", "reason"]

    def __init__(self, *args: Any, run: WorkflowRun | None = None, **kwargs: Any) -> None:
        super().__init__(*args, run=run, **kwargs)
        klass = registry.get(run.workflow_class) if run is not None else None
        steps = klass.step_definitions() if klass is not None else ()
        step_field = cast(forms.ChoiceField, self.fields["step"])
        step_field.choices = [(s.name, s.name) for s in steps]
        if run is not None and run.current_step in {s.name for s in steps}:
            step_field.initial = run.current_step


class SignalForm(ReasonForm):
    """Deliver a named signal with a JSON payload, as ``wf.signal()`` would."""

    name = forms.CharField(label=_("Signal name"), max_length=255)
    payload = forms.CharField(
        label=_("Payload (JSON)"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 5, "cols": 60, "spellcheck": "false"}),
        help_text=_('Any JSON value, for example {"amount": 42}. Leave empty for no payload.'),
    )
    idempotency_key = forms.CharField(
        label=_("Idempotency key"),
        max_length=255,
        required=False,
        help_text=_("Optional: a second delivery with the same key changes nothing."),
    )
    field_order = ["name", "payload", "idempotency_key", "reason"]

    def __init__(self, *args: Any, run: WorkflowRun | None = None, **kwargs: Any) -> None:
        super().__init__(*args, run=run, **kwargs)
        klass = registry.get(run.workflow_class) if run is not None else None
        if klass is None:
            return  # a class this code does not have: any name (newer code may know it)
        now = _current_waits(run, klass)
        later = sorted(klass.signal_names() - set(now))
        choices: list[tuple[Any, Any]] = []
        if now:
            choices.append((_("Waited for now"), [(n, n) for n in now]))
        if later:
            choices.append((_("Waited for by other steps (stays pending until then)"), [(n, n) for n in later]))
        self.fields["name"] = forms.ChoiceField(
            label=_("Signal name"),
            choices=choices,
            initial=now[0] if now else None,
            help_text=_("The names the workflow's steps wait for (and its extra_signals)."),
        )

    def clean_payload(self) -> Any:
        """The decoded payload (None when empty); bad JSON is a form error."""
        text = self.cleaned_data["payload"].strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(
                _("This is not valid JSON: %(error)s"), code="invalid_json", params={"error": error}
            ) from error
        except RecursionError as error:
            raise forms.ValidationError(_("This JSON is nested too deeply."), code="too_deep") from error
        try:
            return encode_payload(value, "The payload")
        except (PayloadNotSerializable, PayloadTooLarge) as error:
            raise forms.ValidationError(str(error), code="unstorable") from error

    def clean_idempotency_key(self) -> str | None:
        """None rather than an empty key, so that an empty field never deduplicates."""
        return self.cleaned_data["idempotency_key"].strip() or None


def _current_waits(run: WorkflowRun | None, klass: Any) -> list[str]:
    """The signal names the run's active attempt waits for (its step's, after a rename too)."""
    if run is None:
        return []
    active = WorkflowStep.objects.filter(run_id=run.pk, status__in=ACTIVE_STEP).order_by("-pk").first()
    if active is None:
        return []
    definition = klass.step_definition(active.step_name)
    names = [*(active.wait_for or []), *(definition.wait_for if definition is not None else ())]
    return list(dict.fromkeys(names))


# -- the operations ------------------------------------------------------------------------------


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
    return states.allowed_verbs(run_facts(run, active, now))


def run_facts(run: WorkflowRun, active: WorkflowStep | None, now: datetime) -> states.RunFacts:
    """What ``states.allowed_verbs`` needs to know about ``run`` and its active attempt."""
    klass = registry.get(run.workflow_class)
    return states.RunFacts(
        status=run.status,
        active_status=active.status if active is not None else None,
        active_due_later=active is not None and active.scheduled_at > now,
        active_waits_for_signal=active is not None and bool(active.wait_for),
        class_known=klass is not None,
        current_step_known=klass is not None and klass.step_definition(run.current_step) is not None,
        class_has_steps=klass is not None and bool(klass.step_definitions()),
        takes_signals=klass is None or bool(klass.signal_names()),
    )


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
