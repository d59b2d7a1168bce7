"""Every import path users have keeps working while the package's modules move to new homes.

The names documented in the README and the docs, the admin's registration (Django autodiscovers
``pgbus_workflows.admin``) and the management commands: a move that forgets a re-export
fails here, not in a user's project.
"""

import importlib

import pytest
from django.contrib import admin
from django.core.management import get_commands, load_command_class

import pgbus_workflows
from pgbus_workflows.models import (
    Dispatcher,
    FanOutJob,
    ScheduleEvent,
    WorkflowEvent,
    WorkflowRun,
    WorkflowSchedule,
    WorkflowSignal,
    WorkflowStep,
)

PUBLIC = {
    "pgbus_workflows.metrics": ["DatabaseCollector", "install", "metrics_view", "serve"],
    "pgbus_workflows.tracing": ["AttemptSpan", "attempt_span", "available", "carrier"],
    "pgbus_workflows.testing": ["WorkflowTestMixin", "tick_schedules"],
    "pgbus_workflows.services.schedules": ["pause", "resume", "fire_now"],
    # Not in the docs, but the tests and bench start dispatchers in-process through it.
    "pgbus_workflows.dispatcher": ["WorkflowDispatcher"],
}


@pytest.mark.parametrize(("module", "names"), PUBLIC.items())
def test_a_documented_module_offers_its_names(module, names):
    imported = importlib.import_module(module)
    assert [name for name in names if not hasattr(imported, name)] == []


def test_the_package_offers_every_name_of_its_all():
    assert [name for name in pgbus_workflows.__all__ if not hasattr(pgbus_workflows, name)] == []


def test_the_admin_registers_every_model_users_operate():
    registered = set(admin.site._registry)
    models = {Dispatcher, FanOutJob, WorkflowEvent, WorkflowRun, WorkflowSchedule, WorkflowSignal, WorkflowStep}
    assert models <= registered
    assert ScheduleEvent._meta.app_label == WorkflowRun._meta.app_label == "pgbus_workflows"


@pytest.mark.parametrize("name", ["run_workflow_dispatcher", "workflows"])
def test_the_management_commands_load(name):
    assert get_commands()[name] == "pgbus_workflows"
    assert load_command_class("pgbus_workflows", name).help
