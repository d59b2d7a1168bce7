"""Two versions of the same code, for the deploy tests: ``TESTAPP_CODE=old`` or ``new`` (the default).

The test process (the web tier) runs the new code; a dispatcher started with
``env={"TESTAPP_CODE": "old"}`` runs the old one, as during a rolling deploy.
"""

import os

from pgbus_workflows import Workflow, removed_step, step

from .models import SideEffect


def mark(workflow, label: str) -> None:
    """Record that the body ran (not imported from ``workflows``: this module must not register those)."""
    SideEffect.objects.create(label=label, key=str(workflow.workflow_id))


CODE = os.environ.get("TESTAPP_CODE", "new")


class Evolving(Workflow):
    """The new code adds a step between ``first`` and ``last``, and renames ``review``."""

    name = "deploy_evolving"

    @step
    def first(self):
        mark(self, "first")

    if CODE == "new":

        @step
        def added(self):
            mark(self, "added")

        @step(wait_for="approved", renamed_from="review")
        def signoff(self):
            mark(self, f"signoff:{self.received_signal.payload}")

    else:

        @step(wait_for="approved")
        def review(self):
            mark(self, f"review:{self.received_signal.payload}")

    @step
    def last(self):
        mark(self, "last")


class Retiring(Workflow):
    """The new code removes ``manager_review`` (a gravestone) and waits in ``manager_signoff``."""

    name = "deploy_retiring"

    @step
    def first(self):
        mark(self, "first")

    if CODE == "new":
        manager_review = removed_step()

        @step(wait_for="approved")
        def manager_signoff(self):
            mark(self, f"signoff:{self.received_signal.payload}")

    else:

        @step(wait_for="approved", wait_timeout=3600)
        def manager_review(self):
            mark(self, f"review:{self.received_signal.payload}")


if CODE == "new":

    class NewOnly(Workflow):
        """A class only the new code has."""

        name = "deploy_new_only"

        @step
        def only(self):
            mark(self, "only")
