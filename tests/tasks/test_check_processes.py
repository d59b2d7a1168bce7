"""The system check of a project that names ``WorkflowsBackend`` in ``TASKS`` without installing the app.

A process of its own: the app's models are imported in this one, and the crash the check
prevents came from importing them without the app.
"""

import json
import subprocess
import sys

import pytest

from tests.procs import ROOT

pytestmark = pytest.mark.processes


def test_the_check_names_the_app_when_the_backend_is_configured_without_it():
    script = (
        "import django, json; django.setup()\n"
        # A project's task module imports the API (django.tasks), which registers its check.
        "from pgbus_workflows.tasks.api import task_backends\n"
        "from django.core import checks\n"
        "from django.core.exceptions import ImproperlyConfigured\n"
        "messages = [(m.id, m.msg, m.hint) for m in checks.run_checks()]\n"
        "try:\n"
        "    task_backends['default'].get_result('00000000-0000-0000-0000-000000000000')\n"
        "except ImproperlyConfigured as error:\n"
        "    messages.append(('get_result', str(error), None))\n"
        "print(json.dumps(messages))\n"
    )
    env = {"DJANGO_SETTINGS_MODULE": "tests.tasks.settings_without_the_app", "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    messages = json.loads(done.stdout)
    assert [message[0] for message in messages] == ["pgbus_workflows.E015", "get_result"]
    assert "TASKS['default'] uses WorkflowsBackend, but pgbus_workflows is not installed" in messages[0][1]
    assert "add 'pgbus_workflows' to INSTALLED_APPS" in messages[0][2]
    assert "add 'pgbus_workflows' to INSTALLED_APPS" in messages[1][1]
