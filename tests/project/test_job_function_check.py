"""``manage.py check --database default`` names pending fan-out jobs whose function the code lost."""

from io import StringIO

import pytest
from django.core.checks import Tags, run_checks
from django.core.management import call_command

from pgbus_workflows.models import FanOutJob
from tests.support import run_next
from tests.testapp.workflows import FanDrain

pytestmark = pytest.mark.django_db

LOST = "tests.testapp.jobs.record_job_renamed"


def job_function_warnings():
    return [m for m in run_checks(tags=[Tags.database], databases=["default"]) if m.id == "pgbus_workflows.W012"]


def test_pending_jobs_whose_function_cannot_be_imported_are_named_with_their_count_and_a_hint():
    lost = run_next(FanDrain.start(count=3))
    kept = run_next(FanDrain.start(count=2))
    assert job_function_warnings() == []

    FanOutJob.objects.filter(step=lost).update(function=LOST)
    FanOutJob.objects.filter(step=kept, index=0).update(function="os.system")  # not in an installed app
    FanOutJob.objects.filter(step=kept, index=1).update(function=LOST, status="failed")  # not pending

    warnings = job_function_warnings()

    assert [w.msg.split(":")[0] for w in warnings] == [  # by function path
        "1 pending fan-out job(s) of function 'os.system', which this code cannot run",
        f"3 pending fan-out job(s) of function {LOST!r}, which this code cannot run",
    ]
    assert "not in an installed app" in warnings[0].msg
    assert "cannot be imported" in warnings[1].msg
    assert "UNKNOWN_STEP_GRACE" in warnings[1].hint and "Deploy the code that defines it" in warnings[1].hint


def test_manage_py_check_with_the_database_says_it():
    FanOutJob.objects.filter(step=run_next(FanDrain.start(count=1))).update(function=LOST)
    out, err = StringIO(), StringIO()

    call_command("check", "--database", "default", stdout=out, stderr=err)

    assert f"(pgbus_workflows.W012) 1 pending fan-out job(s) of function {LOST!r}" in out.getvalue() + err.getvalue()

    plain = StringIO()
    call_command("check", stdout=plain, stderr=plain)
    assert "W012" not in plain.getvalue(), "without --database no query is made"
