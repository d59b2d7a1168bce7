"""E016: the app's rows live on the ``default`` database; a router that sends them elsewhere is an error."""

from django.core.checks import Error
from django.test import override_settings

from pgbus_workflows.checks import check_routing


class ReadsOnAReplica:
    """What a project with a read replica writes: every read to the replica."""

    def db_for_read(self, model, **hints):
        return "replica"

    def db_for_write(self, model, **hints):
        return None


class OtherAppsElsewhere:
    """A router for the project's own apps, which leaves pgbus_workflows to the default."""

    def db_for_read(self, model, **hints):
        return None if model._meta.app_label == "pgbus_workflows" else "replica"

    db_for_write = db_for_read


def test_without_routers_nothing_is_said():
    assert check_routing() == []


@override_settings(DATABASE_ROUTERS=[f"{__name__}.OtherAppsElsewhere"])
def test_a_router_that_leaves_the_app_alone_is_fine():
    assert check_routing() == []


@override_settings(DATABASE_ROUTERS=[f"{__name__}.ReadsOnAReplica"])
def test_a_router_that_sends_the_apps_reads_to_a_replica_is_an_error_for_each_model():
    errors = check_routing()
    assert errors and all(isinstance(e, Error) and e.id == "pgbus_workflows.E016" for e in errors)
    run = next(e for e in errors if e.obj.__name__ == "WorkflowRun")
    assert "DATABASE_ROUTERS send the reads of WorkflowRun to 'replica'" in run.msg
    assert not any("writes" in e.msg for e in errors)
