"""``Workflow.route_attempt``: a class routes each new attempt to a queue and a priority of its choosing.

The default is the step's ``queue=``/``priority=``, else ``step_options``, else ``DEFAULT_QUEUE``
and 0; the task backend routes each task by its ``queue_name`` and ``priority`` through the
same public hook; a route that is not one raises ``ConfigurationError`` naming the class.
"""

import pytest

from pgbus_workflows import AttemptRoute, ConfigurationError, Workflow, step
from pgbus_workflows.conf import settings
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.services.executor import execute_step
from pgbus_workflows.tasks.runs import TaskRun

pytestmark = pytest.mark.django_db


class ByTenant(Workflow):
    """Routes a tenant's attempts to the tenant's queue, the paying ones first."""

    name = "route_by_tenant"
    step_options = {"queue": "shared", "priority": 5}

    @classmethod
    def route_attempt(cls, definition, run):
        default = super().route_attempt(definition, run)
        if definition.name == "ordinary":
            return default
        return AttemptRoute(f"tenant-{run.arguments['tenant']}", 0 if run.arguments["paying"] else default.priority)

    @step(on_exception="reattempt")
    def routed(self):
        if self.attempt == 1 and self.arguments.get("fail_once"):
            raise RuntimeError("once")

    @step
    def ordinary(self):
        pass


class BadRoute(Workflow):
    name = "route_bad"

    @classmethod
    def route_attempt(cls, definition, run):
        return ("", 1)

    @step
    def only(self):
        pass


class Plain(Workflow):
    name = "route_plain"
    step_options = {"priority": 3}

    @step(queue="fast")
    def first(self):
        pass

    @step
    def second(self):
        pass


def attempts(wf):
    return list(
        WorkflowStep.objects.filter(run__workflow_id=wf.workflow_id)
        .order_by("pk")
        .values_list("step_name", "queue", "priority")
    )


def test_a_class_routes_its_attempts_by_the_run_and_falls_back_to_the_default():
    paying = ByTenant.start(tenant="a", paying=True)
    free = ByTenant.start(tenant="b", paying=False)
    assert attempts(paying) == [("routed", "tenant-a", 0)]
    assert attempts(free) == [("routed", "tenant-b", 5)]
    assert claim_due_steps(10, queues=["shared"]) == []  # each tenant's dispatchers take its own
    (claimed,) = claim_due_steps(10, queues=["tenant-a"])
    execute_step(claimed)
    assert attempts(paying)[-1] == ("ordinary", "shared", 5)  # the step the override leaves to the default


def test_every_attempt_is_routed_again_a_reattempt_included():
    wf = ByTenant.start(tenant="c", paying=True, fail_once=True)
    (claimed,) = claim_due_steps(10, queues=["tenant-c"])
    execute_step(claimed)
    assert attempts(wf)[:2] == [("routed", "tenant-c", 0), ("routed", "tenant-c", 0)]


def test_a_route_that_is_not_one_raises_configuration_error_naming_the_class():
    with pytest.raises(ConfigurationError, match=r"BadRoute.route_attempt returned \('', 1\) for step 'only'"):
        BadRoute.start()


def test_the_default_route_is_the_step_s_then_step_options_then_the_default_queue():
    wf = Plain.start()
    assert attempts(wf) == [("first", "fast", 3)]
    route = Plain.route_attempt(Plain.step_definition("second"), wf.record)
    assert route == AttemptRoute(settings.DEFAULT_QUEUE, 3) and route.queue == settings.DEFAULT_QUEUE


def test_the_task_backend_routes_through_the_public_hook():
    assert "route_attempt" in vars(TaskRun)
    assert not any(name.startswith("_attempt_route") for name in dir(TaskRun))
