"""Workflow classes of the holding tests (imported by ``workflows``, so dispatchers know them)."""

import time

from pgbus_workflows import Workflow, step

from .models import SideEffect


class HeldWork(Workflow):
    """Two steps that record their run's id as they run (the class the tests hold)."""

    name = "held_work"
    allow_multiple = True
    step_options = {"queue": "held"}

    @step
    def first(self):
        time.sleep(self.arguments.get("seconds", 0))
        SideEffect.objects.create(label="held-first", key=str(self.workflow_id))

    @step
    def second(self):
        SideEffect.objects.create(label="held-second", key=str(self.workflow_id))


class HeldSignalled(Workflow):
    """Waits for a "go" signal, then records it: a signal sent during a hold is kept."""

    name = "held_signalled"
    allow_multiple = True
    step_options = {"queue": "held"}

    @step(wait_for="go")
    def wait_go(self):
        SideEffect.objects.create(label="held-go", key=str(self.workflow_id))


class FreeWork(Workflow):
    """One step on another queue: it runs while the held class waits."""

    name = "free_work"
    allow_multiple = True
    step_options = {"queue": "free"}

    @step
    def only(self):
        SideEffect.objects.create(label="free", key=str(self.workflow_id))
