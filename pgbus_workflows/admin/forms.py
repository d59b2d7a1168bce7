"""The forms of the operator console's verbs: a reason for every verb, plus what some verbs need.

The operations themselves (which verbs, their permissions, labels and forms, which a run's
state allows, and calling them) are :mod:`.operations`.
"""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.utils.translation import gettext_lazy as _

from ..dsl.declared import registry
from ..exceptions import PayloadNotSerializable, PayloadTooLarge
from ..models import WorkflowRun, WorkflowStep
from ..services.handle import RunHandle
from ..services.payload import encode_payload
from ..services.signals import waits_for
from ..states import ACTIVE_STEP

#: The longest reason an operator may give (the admin's forms and the CLI's ``--reason``).
MAX_REASON_LENGTH = 2000


class ReasonForm(forms.Form):
    """Why the operator acts: recorded on the audit event the verb writes."""

    reason = forms.CharField(
        label=_("Reason"),
        max_length=MAX_REASON_LENGTH,
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
        names = _step_names(run)
        step_field = cast(forms.ChoiceField, self.fields["step"])
        step_field.choices = [(name, name) for name in names]
        if run is not None and run.current_step in names:
            step_field.initial = run.current_step


class ForkForm(ReasonForm):
    """Fork a run at one of its class's steps (on a run's page), or at a step named alike for many."""

    from_step = forms.ChoiceField(
        label=_("From step"),
        help_text=_("The fork starts at this step; the steps before it keep this run's outputs and do not run again."),
    )
    field_order = ["from_step", "reason"]

    def __init__(self, *args: Any, run: WorkflowRun | None = None, **kwargs: Any) -> None:
        super().__init__(*args, run=run, **kwargs)
        if run is None:  # the bulk action: one name for runs of any class (each run's class is asked)
            self.fields["from_step"] = forms.CharField(
                label=_("From step"),
                max_length=255,
                help_text=_("Each selected run is forked at its step of this name; a run without one is left alone."),
            )
            return
        cast(forms.ChoiceField, self.fields["from_step"]).choices = [(name, name) for name in _step_names(run)]


def _step_names(run: WorkflowRun | None) -> list[str]:
    """The steps of ``run``'s class an operator picks from (a durable function's: the checkpoints it reached)."""
    klass = registry.get(run.workflow_class) if run is not None else None
    if run is None or klass is None:
        return []
    if issubclass(klass, RunHandle):
        return klass.step_names_of(run)
    return [s.name for s in klass.step_definitions()]


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
    return waits_for(klass, active)
