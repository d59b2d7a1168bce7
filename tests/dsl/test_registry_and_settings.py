"""The registry of workflow classes, the ``PGBUS_WORKFLOWS`` settings and their system checks."""

import subprocess
import sys
import textwrap
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.core import checks as django_checks
from django.test import override_settings

from pgbus_workflows import ConfigurationError, Workflow, step
from pgbus_workflows.checks import check_database, check_settings
from pgbus_workflows.conf import DEFAULTS
from pgbus_workflows.conf import settings as wf_settings
from pgbus_workflows.dsl.declared import AlreadyRegistered, NotRegistered, registry
from pgbus_workflows.models import WorkflowEvent, WorkflowRun, WorkflowStep

REPO = Path(__file__).resolve().parents[2]


class RegNamed(Workflow):
    name = "reg_named"

    @step
    def one(self):
        return None


class RegDefaultName(Workflow):
    @step
    def one(self):
        return None


class RegParent(Workflow):
    name = "reg_parent"

    @step
    def one(self):
        return None


class RegChild(RegParent):
    name = "reg_child"


class RegUnnamedChild(RegParent):
    """Inherits a named class but not its name: it gets its own default."""


class RegAbstract(Workflow):
    name = "reg_abstract"
    abstract = True

    @step
    def one(self):
        return None


class RegConcrete(RegAbstract):
    name = "reg_concrete"


# -- the registry -------------------------------------------------------------------------------


def test_a_class_registers_under_its_name():
    assert registry.get("reg_named") is RegNamed
    assert registry.is_registered("reg_named")
    assert RegNamed in registry.classes()


def test_the_default_name_is_module_and_qualname():
    assert RegDefaultName.name == "tests.dsl.test_registry_and_settings.RegDefaultName"
    assert registry.get("tests.dsl.test_registry_and_settings.RegDefaultName") is RegDefaultName


def test_a_subclass_without_a_name_gets_its_own_default():
    assert RegUnnamedChild.name == "tests.dsl.test_registry_and_settings.RegUnnamedChild"
    assert registry.get(RegUnnamedChild.name) is RegUnnamedChild
    assert registry.get("reg_parent") is RegParent


def test_a_second_class_with_the_same_name_is_refused_naming_both():
    with pytest.raises(AlreadyRegistered) as info:

        class Impostor(Workflow):
            name = "reg_named"

            @step
            def other(self):
                return None

    message = str(info.value)
    assert "'reg_named'" in message
    assert "tests.dsl.test_registry_and_settings.RegNamed" in message
    assert "test_a_second_class_with_the_same_name_is_refused_naming_both.<locals>.Impostor" in message
    assert isinstance(info.value, ConfigurationError)
    assert registry.get("reg_named") is RegNamed


def test_the_same_class_defined_again_replaces_the_first():
    """As when a module is reloaded: same module and qualified name."""
    defined = []
    try:
        for _ in range(2):

            class Reloaded(Workflow):
                name = "reg_reloaded"

                @step
                def one(self):
                    return None

            defined.append(Reloaded)
        assert defined[0] is not defined[1]
        assert registry.get("reg_reloaded") is defined[1]
    finally:
        registry.unregister("reg_reloaded")
    assert not registry.is_registered("reg_reloaded")


def test_abstract_classes_are_not_registered():
    assert not registry.is_registered("reg_abstract")
    assert RegAbstract not in registry.classes()
    assert Workflow not in registry.classes()
    # abstract is not inherited: the subclass registers
    assert registry.get("reg_concrete") is RegConcrete


def test_an_abstract_class_cannot_start(db):
    with pytest.raises(ConfigurationError, match=r"RegAbstract is abstract: start one of its subclasses"):
        RegAbstract.start()
    assert WorkflowRun.objects.count() == 0


def test_the_framework_bases_are_abstract_and_a_gone_class_loads_as_the_bare_base_of_its_layer():
    from pgbus_workflows.dsl.declared import DeclaredWorkflow
    from pgbus_workflows.services.handle import RunHandle, handle_class

    assert DeclaredWorkflow.abstract and RunHandle.abstract and Workflow.abstract
    names = {cls.__name__ for cls in registry.classes()}
    assert {"DeclaredWorkflow", "RunHandle", "Workflow"}.isdisjoint(names)
    assert handle_class("reg_never_defined") is RunHandle  # the engine's handle
    assert handle_class("reg_never_defined", gone=Workflow) is Workflow  # what workflow.handle_for passes


def test_a_class_declared_without_workflow_is_refused_when_a_run_of_it_is_handled(db):
    from pgbus_workflows.dsl.declared import DeclaredWorkflow
    from pgbus_workflows.services.handle import RunHandle, handle_class

    class Declared(DeclaredWorkflow):
        name = "reg_declared_only"

        @step
        def one(self):
            return None

    try:
        assert registry.get("reg_declared_only") is Declared
        with pytest.raises(ConfigurationError, match=r"is not a Workflow subclass: subclass pgbus_workflows.Workflow"):
            handle_class("reg_declared_only")
        assert handle_class(RegNamed.name) is RegNamed
        assert handle_class("reg_gone_long_ago") is RunHandle
    finally:
        registry.unregister("reg_declared_only")


def test_unregister_an_unknown_name_raises():
    with pytest.raises(NotRegistered, match=r"No workflow class is registered as 'reg_never'"):
        registry.unregister("reg_never")
    assert registry.get("reg_never") is None


def test_find_returns_a_handle_of_the_right_class(order):
    wf = RegNamed.start(order)
    found = Workflow.find(wf.workflow_id)
    assert type(found) is RegNamed
    assert found.workflow_id == wf.workflow_id
    assert found.record.pk == wf.record.pk
    assert found.duplicate_start is False
    assert type(RegNamed.find(wf.workflow_id)) is RegNamed
    assert type(Workflow.find(str(wf.workflow_id))) is RegNamed


def test_find_returns_none_for_an_unknown_or_malformed_id(db):
    assert Workflow.find(uuid.uuid4()) is None
    assert Workflow.find("not-a-uuid") is None
    assert RegNamed.find(uuid.uuid4()) is None


def test_a_subclass_finds_only_its_own_runs(order):
    named = RegNamed.start(order)
    parent = RegParent.start(order)
    child = RegChild.start(order)
    assert RegParent.find(named.workflow_id) is None
    assert RegNamed.find(parent.workflow_id) is None
    assert RegChild.find(parent.workflow_id) is None
    # a parent class finds the runs of its subclasses, as handles of the subclass
    assert type(RegParent.find(child.workflow_id)) is RegChild
    assert type(RegChild.find(child.workflow_id)) is RegChild


def test_a_run_whose_class_is_gone_loads_as_a_bare_workflow_and_can_be_cancelled(order):
    class Gone(Workflow):
        name = "reg_gone"

        @step
        def one(self):
            return None

    try:
        wf = Gone.start(order)
    finally:
        registry.unregister("reg_gone")

    found = Workflow.find(wf.workflow_id)
    assert type(found) is Workflow
    assert found.record.workflow_class == "reg_gone"
    assert found.status == "ready"
    assert found.current_step == "one"
    assert [s.step_name for s in found.steps] == ["one"]
    assert found.subject == order
    # a registered class does not claim it
    assert RegNamed.find(wf.workflow_id) is None

    found.cancel(actor="ops", reason="class deleted")
    run = WorkflowRun.objects.get(pk=wf.record.pk)
    assert run.status == "cancelled"
    assert run.finished_at is not None
    assert WorkflowStep.objects.get(run=run).status == "cancelled"
    event = WorkflowEvent.objects.filter(run=run).order_by("id").last()
    assert (event.kind, event.actor, event.reason, event.to_status) == (
        "cancelled",
        "ops",
        "class deleted",
        "cancelled",
    )


# -- autodiscovery -----------------------------------------------------------------------------


def test_autodiscovery_registered_the_test_app_workflows_at_startup():
    cls = registry.get("three_steps")
    assert cls is not None
    assert cls.__module__ == "tests.testapp.workflows"
    assert cls.__qualname__ == "ThreeSteps"
    assert "tests.testapp.workflows" in sys.modules


def _registered_after_setup(app_config: str, pgbus_settings: dict) -> str:
    """Set Django up in a fresh interpreter and say whether three_steps got registered."""
    script = textwrap.dedent(
        f"""
        import django
        from django.conf import settings
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", {app_config!r}, "tests.testapp"],
            DATABASES={{}},
            PGBUS_WORKFLOWS={pgbus_settings!r},
        )
        django.setup()
        from pgbus_workflows.dsl.declared import registry
        print(registry.is_registered("three_steps"))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.processes
def test_autodiscovery_imports_each_app_s_workflows_module_at_setup():
    assert _registered_after_setup("pgbus_workflows", {}) == "True"


@pytest.mark.processes
def test_autodiscover_module_none_turns_discovery_off():
    assert _registered_after_setup("pgbus_workflows", {"AUTODISCOVER_MODULE": None}) == "False"


@pytest.mark.processes
def test_the_simple_app_config_does_not_discover():
    assert _registered_after_setup("pgbus_workflows.apps.SimplePgbusWorkflowsConfig", {}) == "False"


# -- conf ----------------------------------------------------------------------------------------


def test_defaults(settings):
    del settings.PGBUS_WORKFLOWS
    assert wf_settings.SWEEP_INTERVAL == timedelta(seconds=60)
    assert wf_settings.STALL_THRESHOLD == timedelta(hours=1)
    assert wf_settings.STALL_ACTION == "reattempt"
    assert wf_settings.RETENTION == timedelta(days=30)
    assert wf_settings.WAITING_VISIBILITY_THRESHOLD == timedelta(hours=24)
    assert wf_settings.MAX_PAYLOAD_SIZE == 65536
    assert wf_settings.DEFAULT_QUEUE == "workflows"
    assert wf_settings.POLL_INTERVAL == timedelta(seconds=1)
    assert wf_settings.HEARTBEAT_INTERVAL == timedelta(seconds=10)
    assert wf_settings.DISPATCHER_DEAD_AFTER == timedelta(seconds=60)
    assert wf_settings.NOTIFY_CHANNEL == "pgbus_workflows"
    assert wf_settings.AUTODISCOVER_MODULE == "workflows"
    assert wf_settings.PREPARED_STATEMENTS is True
    assert wf_settings.ASYNC_CONCURRENCY == 100


def test_an_empty_dict_gives_the_defaults():
    with override_settings(PGBUS_WORKFLOWS={}):
        assert wf_settings.MAX_PAYLOAD_SIZE == 65536
        assert wf_settings.SWEEP_INTERVAL == timedelta(seconds=60)


def test_the_test_settings_lower_max_payload_size():
    assert wf_settings.MAX_PAYLOAD_SIZE == 4096
    # keys the project does not set keep their defaults
    assert wf_settings.DEFAULT_QUEUE == "workflows"


def test_durations_given_as_seconds_come_back_as_timedelta():
    with override_settings(
        PGBUS_WORKFLOWS={
            "SWEEP_INTERVAL": 30,
            "POLL_INTERVAL": 0.25,
            "STALL_THRESHOLD": timedelta(minutes=5),
            "RETENTION": 86400,
            "WAITING_VISIBILITY_THRESHOLD": 7200,
            "HEARTBEAT_INTERVAL": 2,
            "DISPATCHER_DEAD_AFTER": 20,
        }
    ):
        assert wf_settings.SWEEP_INTERVAL == timedelta(seconds=30)
        assert wf_settings.POLL_INTERVAL == timedelta(milliseconds=250)
        assert wf_settings.STALL_THRESHOLD == timedelta(minutes=5)
        assert wf_settings.RETENTION == timedelta(days=1)
        assert wf_settings.WAITING_VISIBILITY_THRESHOLD == timedelta(hours=2)
        assert wf_settings.HEARTBEAT_INTERVAL == timedelta(seconds=2)
        assert wf_settings.DISPATCHER_DEAD_AFTER == timedelta(seconds=20)
        for key in ("SWEEP_INTERVAL", "POLL_INTERVAL", "STALL_THRESHOLD", "RETENTION"):
            assert isinstance(getattr(wf_settings, key), timedelta)


def test_retention_none_keeps_runs_forever():
    with override_settings(PGBUS_WORKFLOWS={"RETENTION": None}):
        assert wf_settings.RETENTION is None


def test_override_settings_works_live():
    assert wf_settings.DEFAULT_QUEUE == "workflows"
    with override_settings(PGBUS_WORKFLOWS={"DEFAULT_QUEUE": "elsewhere", "MAX_PAYLOAD_SIZE": 10}):
        assert wf_settings.DEFAULT_QUEUE == "elsewhere"
        assert wf_settings.MAX_PAYLOAD_SIZE == 10
        with override_settings(PGBUS_WORKFLOWS={"STALL_ACTION": "cancel"}):
            assert wf_settings.STALL_ACTION == "cancel"
            assert wf_settings.DEFAULT_QUEUE == "workflows"
        assert wf_settings.DEFAULT_QUEUE == "elsewhere"
    assert wf_settings.DEFAULT_QUEUE == "workflows"
    assert wf_settings.MAX_PAYLOAD_SIZE == 4096


def test_the_pytest_django_settings_fixture_works_live(settings):
    settings.PGBUS_WORKFLOWS = {"SWEEP_INTERVAL": 5}
    assert wf_settings.SWEEP_INTERVAL == timedelta(seconds=5)
    settings.PGBUS_WORKFLOWS = {"SWEEP_INTERVAL": 7}
    assert wf_settings.SWEEP_INTERVAL == timedelta(seconds=7)


def test_an_unknown_setting_is_an_attribute_error():
    with pytest.raises(AttributeError, match=r"PGBUS_WORKFLOWS has no setting 'SWEEP_INTERVALL'"):
        _ = wf_settings.SWEEP_INTERVALL


# -- checks ------------------------------------------------------------------------------------


def _check(value):
    with override_settings(PGBUS_WORKFLOWS=value):
        return check_settings()


@pytest.mark.parametrize(
    ("value", "error_id", "message"),
    [
        (["SWEEP_INTERVAL", 30], "pgbus_workflows.E001", "PGBUS_WORKFLOWS must be a dict."),
        ("SWEEP_INTERVAL=30", "pgbus_workflows.E001", "PGBUS_WORKFLOWS must be a dict."),
        ({"SWEEP_INTERVALL": 30}, "pgbus_workflows.E002", "PGBUS_WORKFLOWS has an unknown key 'SWEEP_INTERVALL'."),
        (
            {"SWEEP_INTERVAL": "30"},
            "pgbus_workflows.E003",
            "PGBUS_WORKFLOWS['SWEEP_INTERVAL'] must be seconds or a timedelta, got '30'.",
        ),
        (
            {"STALL_THRESHOLD": True},
            "pgbus_workflows.E003",
            "PGBUS_WORKFLOWS['STALL_THRESHOLD'] must be seconds or a timedelta, got True.",
        ),
        (
            {"RETENTION": "30d"},
            "pgbus_workflows.E003",
            "PGBUS_WORKFLOWS['RETENTION'] must be seconds or a timedelta, got '30d'.",
        ),
        ({"POLL_INTERVAL": None}, "pgbus_workflows.E003", "PGBUS_WORKFLOWS['POLL_INTERVAL'] must be seconds"),
        ({"SWEEP_INTERVAL": 0}, "pgbus_workflows.E004", "PGBUS_WORKFLOWS['SWEEP_INTERVAL'] must be > 0, got 0."),
        ({"HEARTBEAT_INTERVAL": -1}, "pgbus_workflows.E004", "PGBUS_WORKFLOWS['HEARTBEAT_INTERVAL'] must be > 0"),
        (
            {"RETENTION": timedelta(seconds=-1)},
            "pgbus_workflows.E004",
            "PGBUS_WORKFLOWS['RETENTION'] must be > 0",
        ),
        (
            {"STALL_ACTION": "explode"},
            "pgbus_workflows.E005",
            "PGBUS_WORKFLOWS['STALL_ACTION'] must be one of reattempt, pause, cancel, got 'explode'.",
        ),
        ({"STALL_ACTION": "skip"}, "pgbus_workflows.E005", "PGBUS_WORKFLOWS['STALL_ACTION'] must be one of"),
        (
            {"MAX_PAYLOAD_SIZE": 0},
            "pgbus_workflows.E006",
            "PGBUS_WORKFLOWS['MAX_PAYLOAD_SIZE'] must be a positive integer, got 0.",
        ),
        ({"MAX_PAYLOAD_SIZE": "64k"}, "pgbus_workflows.E006", "PGBUS_WORKFLOWS['MAX_PAYLOAD_SIZE'] must be a positive"),
        (
            {"MAX_PAYLOAD_SIZE": 4096.0},
            "pgbus_workflows.E006",
            "PGBUS_WORKFLOWS['MAX_PAYLOAD_SIZE'] must be a positive",
        ),
        ({"MAX_PAYLOAD_SIZE": True}, "pgbus_workflows.E006", "PGBUS_WORKFLOWS['MAX_PAYLOAD_SIZE'] must be a positive"),
        (
            {"ASYNC_CONCURRENCY": -1},
            "pgbus_workflows.E012",
            "PGBUS_WORKFLOWS['ASYNC_CONCURRENCY'] must be an integer >= 0, got -1.",
        ),
        ({"ASYNC_CONCURRENCY": 1.5}, "pgbus_workflows.E012", "PGBUS_WORKFLOWS['ASYNC_CONCURRENCY'] must be an integer"),
        (
            {"ASYNC_CONCURRENCY": True},
            "pgbus_workflows.E012",
            "PGBUS_WORKFLOWS['ASYNC_CONCURRENCY'] must be an integer",
        ),
        (
            {"PREPARED_STATEMENTS": "no"},
            "pgbus_workflows.E011",
            "PGBUS_WORKFLOWS['PREPARED_STATEMENTS'] must be True or",
        ),
        (
            {"DEFAULT_QUEUE": ""},
            "pgbus_workflows.E007",
            "PGBUS_WORKFLOWS['DEFAULT_QUEUE'] must be a non-empty string, got ''.",
        ),
        ({"NOTIFY_CHANNEL": 5}, "pgbus_workflows.E007", "PGBUS_WORKFLOWS['NOTIFY_CHANNEL'] must be a non-empty string"),
        ({"DEFAULT_QUEUE": None}, "pgbus_workflows.E007", "PGBUS_WORKFLOWS['DEFAULT_QUEUE'] must be a non-empty"),
        (
            {"AUTODISCOVER_MODULE": ""},
            "pgbus_workflows.E008",
            "PGBUS_WORKFLOWS['AUTODISCOVER_MODULE'] must be a module name or None, got ''.",
        ),
        ({"AUTODISCOVER_MODULE": 3}, "pgbus_workflows.E008", "PGBUS_WORKFLOWS['AUTODISCOVER_MODULE'] must be a module"),
    ],
)
def test_each_bad_value_gives_its_error(value, error_id, message):
    errors = _check(value)
    assert [e.id for e in errors] == [error_id]
    assert message in errors[0].msg
    assert errors[0].level == django_checks.ERROR


def test_an_unknown_key_hints_at_the_known_ones():
    (error,) = _check({"SWEEP_INTERVALL": 30})
    assert error.hint == f"Known keys: {', '.join(sorted(DEFAULTS))}."


@pytest.mark.parametrize("value", [float("nan"), 1e20])
def test_a_duration_timedelta_cannot_hold_is_reported_not_a_crash(value):
    errors = _check({"SWEEP_INTERVAL": value})
    assert [e.id for e in errors] == ["pgbus_workflows.E003"]
    assert "PGBUS_WORKFLOWS['SWEEP_INTERVAL'] must be seconds or a timedelta" in errors[0].msg


def test_every_bad_value_is_reported_at_once():
    errors = _check(
        {
            "SWEEP_INTERVAL": "soon",
            "STALL_THRESHOLD": 0,
            "STALL_ACTION": "explode",
            "MAX_PAYLOAD_SIZE": -1,
            "DEFAULT_QUEUE": "",
            "AUTODISCOVER_MODULE": "",
            "TYPO": 1,
        }
    )
    assert sorted(e.id for e in errors) == [
        "pgbus_workflows.E002",
        "pgbus_workflows.E003",
        "pgbus_workflows.E004",
        "pgbus_workflows.E005",
        "pgbus_workflows.E006",
        "pgbus_workflows.E007",
        "pgbus_workflows.E008",
    ]


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"MAX_PAYLOAD_SIZE": 4096},
        {"RETENTION": None, "AUTODISCOVER_MODULE": None},
        {
            "SWEEP_INTERVAL": 30,
            "STALL_THRESHOLD": timedelta(minutes=10),
            "STALL_ACTION": "pause",
            "RETENTION": timedelta(days=7),
            "WAITING_VISIBILITY_THRESHOLD": 3600.5,
            "MAX_PAYLOAD_SIZE": 1,
            "DEFAULT_QUEUE": "q",
            "POLL_INTERVAL": 0.1,
            "HEARTBEAT_INTERVAL": 5,
            "DISPATCHER_DEAD_AFTER": 30,
            "NOTIFY_CHANNEL": "chan",
            "AUTODISCOVER_MODULE": "jobs",
        },
        {"STALL_ACTION": "cancel"},
        {"STALL_ACTION": "reattempt"},
        {"ASYNC_CONCURRENCY": 0},
    ],
)
def test_a_good_config_gives_no_error(value):
    assert _check(value) == []


def test_no_setting_at_all_gives_no_error(settings):
    del settings.PGBUS_WORKFLOWS
    assert check_settings() == []


def test_the_settings_check_is_registered_with_django():
    with override_settings(PGBUS_WORKFLOWS={"STALL_ACTION": "explode"}):
        ids = [m.id for m in django_checks.run_checks(tags=[django_checks.Tags.compatibility])]
    assert "pgbus_workflows.E005" in ids
    with override_settings(PGBUS_WORKFLOWS={}):
        ids = [m.id for m in django_checks.run_checks(tags=[django_checks.Tags.compatibility])]
    # W004 (a class without `name`) is about classes: this module defines nameless ones on purpose.
    assert not [i for i in ids if i and i.startswith("pgbus_workflows.") and i != "pgbus_workflows.W004"]


def test_postgresql_passes_the_database_check():
    assert check_database(databases=["default"]) == []
    assert check_database(databases=None) == []


def test_settings_are_read_once_and_again_when_the_setting_is_replaced_or_deleted(settings):
    settings.PGBUS_WORKFLOWS = {"BATCH_SIZE": 50}
    assert wf_settings.BATCH_SIZE == 50
    settings.PGBUS_WORKFLOWS["BATCH_SIZE"] = 7  # changed in place: the same dict, the value read is kept
    assert wf_settings.BATCH_SIZE == 50
    settings.PGBUS_WORKFLOWS = {"BATCH_SIZE": 7}
    assert wf_settings.BATCH_SIZE == 7
    del settings.PGBUS_WORKFLOWS  # pytest-django sends no setting_changed for a deletion
    assert wf_settings.BATCH_SIZE == 100
