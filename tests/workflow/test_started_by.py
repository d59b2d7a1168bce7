"""``Cls.started_by(actor, reason=...)``: who started a run and why, on its audit trail.

``start()``'s keywords stay the run's arguments (``actor`` and ``reason`` among them); the
actor and reason go on the ``started`` event, which the admin's run page and
``manage.py workflows show`` read.
"""

import json
from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command

from pgbus_workflows import Debounce, Workflow, step
from pgbus_workflows.models import WorkflowRun
from pgbus_workflows.services.executor import run_due_steps
from tests.support import events_of, run_page
from tests.testapp.models import Order

Q = "started_by_q"


class Onboarding(Workflow):
    name = "started_by_onboarding"
    step_options = {"queue": Q}
    allow_multiple = True

    @step
    def welcome(self):
        return self.arguments


class Digest(Workflow):
    name = "started_by_digest"
    step_options = {"queue": Q}
    debounce = Debounce(period=timedelta(minutes=5), key=lambda wf: f"account:{wf.arguments['account']}")

    @step
    def send(self):
        pass


def started(wf) -> tuple[str, str]:
    event = events_of(wf, "started")[0]
    return event.actor, event.reason


@pytest.mark.django_db
def test_started_by_records_the_actor_and_the_reason_on_the_started_event(order):
    wf = Onboarding.started_by("support:ann", reason="ticket 4411: welcome mail lost").start(order, plan="pro")

    assert started(wf) == ("support:ann", "ticket 4411: welcome mail lost")
    assert wf.record.arguments == {"plan": "pro"}
    assert wf.record.start_audit() == ("support:ann", "ticket 4411: welcome mail lost")


@pytest.mark.django_db
def test_start_alone_records_the_system_actor_and_no_reason(order):
    wf = Onboarding.start(order)

    assert started(wf) == ("system", "")


@pytest.mark.django_db
def test_actor_and_reason_remain_argument_names_of_start(order):
    wf = Onboarding.started_by("cron:billing").start(order, actor="the customer", reason="upgrade")
    run_due_steps(queues=[Q])

    assert wf.reload().status == "finished"
    assert wf.record.arguments == {"actor": "the customer", "reason": "upgrade"}
    assert started(wf) == ("cron:billing", "")
    plain = Onboarding.start(order, actor="x")
    assert (plain.record.arguments, started(plain)) == ({"actor": "x"}, ("system", ""))


@pytest.mark.django_db
def test_start_many_records_the_actor_and_reason_on_every_run():
    orders = [Order.objects.create() for _ in range(3)]
    handles = Onboarding.started_by("import:crm", reason="backfill").start_many(orders)

    assert [started(wf) for wf in handles] == [("import:crm", "backfill")] * 3


@pytest.mark.django_db(transaction=True)
def test_astart_records_them_from_async_code():
    order = Order.objects.create()
    # asgiref's bridge, as an async view awaits it (on the thread of this test's connection)
    wf = async_to_sync(Onboarding.started_by("api:signup", reason="self-serve").astart)(order, plan="free")

    assert started(wf) == ("api:signup", "self-serve")
    assert wf.record.arguments == {"plan": "free"}


@pytest.mark.django_db
def test_a_debounced_class_records_them_on_the_run_it_starts():
    first = Digest.started_by("webhook:stripe", reason="invoice.paid").start(account=7)
    again = Digest.started_by("webhook:stripe", reason="invoice.paid again").start(account=7)

    assert again.debounced and again.workflow_id == first.workflow_id
    assert started(first) == ("webhook:stripe", "invoice.paid")


@pytest.mark.django_db
def test_a_rerun_records_its_operator_and_reason_on_the_new_run(order):
    wf = Onboarding.start(order)
    run_due_steps(queues=[Q])

    again = wf.reload().rerun(actor="ops:bo", reason="mail server fixed")

    assert started(again) == ("ops:bo", "mail server fixed")


@pytest.mark.parametrize(
    ("actor", "reason", "said"),
    [
        ("", None, "needs an actor: a non-empty string"),
        ("   ", None, "needs an actor"),
        (None, None, "needs an actor"),
        ("a" * 256, None, "actor must be at most 255 characters, got 256"),
        ("ann", "r" * 2001, "reason must be at most 2000 characters, got 2001"),
        ("ann", 42, "reason must be a string or None, got int"),
        ("ann\x00", None, r"actor contains a NUL character"),
        ("ann\ud800", None, r"actor contains a lone surrogate"),
        ("ann", "ticket\x00 4411", r"reason contains a NUL character"),
        ("ann", "ticket \udfff", r"reason contains a lone surrogate"),
    ],
)
def test_a_bad_actor_or_reason_is_refused_before_anything_is_written(actor, reason, said):
    with pytest.raises(ValueError, match=said):
        Onboarding.started_by(actor, reason=reason)


@pytest.mark.django_db
def test_the_admin_run_page_shows_who_started_the_run_and_why(admin_client, order):
    wf = Onboarding.started_by("support:ann", reason="ticket 4411").start(order)

    page = admin_client.get(run_page(wf)).content.decode()

    assert "Started by" in page
    assert "support:ann" in page
    assert "ticket 4411" in page


@pytest.mark.django_db
def test_workflows_show_prints_who_started_the_run_and_why(order):
    wf = Onboarding.started_by("support:ann", reason="ticket 4411").start(order)
    out = StringIO()
    call_command("workflows", "show", str(wf.workflow_id), stdout=out)
    text = out.getvalue()
    assert "started by" in text and "support:ann" in text
    assert "start reason" in text and "ticket 4411" in text

    out = StringIO()
    call_command("workflows", "show", str(wf.workflow_id), "--json", stdout=out)
    run = json.loads(out.getvalue())["run"]
    assert (run["started_by"], run["start_reason"]) == ("support:ann", "ticket 4411")


@pytest.mark.django_db
def test_a_run_whose_started_event_was_pruned_shows_no_starter(order):
    wf = Onboarding.started_by("support:ann").start(order)
    wf.record.events.all().delete()

    assert WorkflowRun.objects.get(pk=wf.record.pk).start_audit() is None
