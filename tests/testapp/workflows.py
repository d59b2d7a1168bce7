"""Workflow classes the tests use, one per behaviour (autodiscovered like a user's)."""


from pgbus_workflows import Workflow, step

from .models import SideEffect


def record(label: str, key: str = "") -> None:
    SideEffect.objects.create(label=label, key=key)


class Flaky(Exception):
    """Raised by steps that fail on purpose."""


class ThreeSteps(Workflow):
    name = "three_steps"

    @step
    def one(self):
        record("one")
        return {"n": 1}

    @step
    def two(self):
        record("two", self.step_idempotency_key)
        return {"n": self.outputs["one"]["n"] + 1}

    @step
    def three(self):
        record("three")
