"""``@step(atomic=True)``: the body's writes commit with its outcome, or roll back when it raises.

These tests use real commits (``transaction=True``) so that "the same commit" is observable:
a body notes ``txid_current()`` (its top-level transaction) and PostgreSQL's ``xmin`` column
names the transaction that last wrote the step row.
"""

import pytest
from django.db import connection

from pgbus_workflows import OnException, Workflow, step
from pgbus_workflows.models import WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps, claim_step
from pgbus_workflows.services.executor import execute_step
from tests.support import run_next, scheduled
from tests.testapp.models import Order, Receipt, SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


class AtomicError(Exception):
    """Raised by the bodies of this file on purpose."""


def xmin(model, pk):
    """The id of the transaction that last wrote the row."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT xmin::text::bigint FROM {model._meta.db_table} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def note_transaction(label):
    """Record ``label`` with the id of the top-level transaction running now (32-bit, like xmin)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid_current()")
        txid = cursor.fetchone()[0] % 2**32
    SideEffect.objects.create(label=label, key=str(txid))


def noted_transaction(label):
    return int(SideEffect.objects.get(label=label).key)


class AtomicFails(Workflow):
    name = "atomic_fails"

    @step(atomic=True)
    def write(self):
        Receipt.objects.create(order=self.subject, note="attempt")
        raise AtomicError("after the write")


class AtomicFailsThenWorks(Workflow):
    name = "atomic_fails_then_works"
    exception_policies = [OnException(AtomicError, action="reattempt", max_reattempts=2)]

    @step(atomic=True)
    def write(self):
        Receipt.objects.create(order=self.subject, note=f"attempt {self.attempt}")
        if self.attempt == 1:
            raise AtomicError("first attempt fails")


class AtomicDatabaseError(Workflow):
    name = "atomic_database_error"

    @step(atomic=True)
    def write(self):
        Receipt.objects.create(order=self.subject, note="before the clash")
        Order.objects.create(pk=self.subject.pk)  # duplicate key: IntegrityError


class AtomicWrites(Workflow):
    name = "atomic_writes"

    @step(atomic=True)
    def write(self):
        note_transaction(f"atomic in_atomic_block={connection.in_atomic_block}")
        receipt = Receipt.objects.create(order=self.subject, note="paid")
        return {"receipt": receipt.pk}

    @step
    def plain(self):
        note_transaction(f"plain in_atomic_block={connection.in_atomic_block}")
        receipt = Receipt.objects.create(order=self.subject, note="plain")
        return {"receipt": receipt.pk}


class AtomicSkips(Workflow):
    name = "atomic_skips"

    @step(atomic=True)
    def write(self):
        Receipt.objects.create(order=self.subject, note="written before skip")
        note_transaction("skip")
        self.skip()

    @step
    def after(self):
        pass


class AtomicDeferredConstraint(Workflow):
    name = "atomic_deferred_constraint"

    @step(atomic=True)
    def write(self):
        # Django's foreign keys are DEFERRABLE INITIALLY DEFERRED: the violation shows at commit
        Receipt.objects.create(order_id=987654321, note="points nowhere")


def test_an_atomic_body_that_raises_rolls_its_write_back_and_records_the_error(order):
    wf = AtomicFails.start(order)
    [claimed] = claim_due_steps(10)

    outcome = execute_step(claimed)

    assert outcome.kind == "error"
    assert Receipt.objects.count() == 0
    row = WorkflowStep.objects.get(pk=claimed.pk)
    assert (row.status, row.outcome) == ("failed", "failed")
    assert (row.error_class, row.error_message) == ("tests.services.test_atomic.AtomicError", "after the write")
    assert "AtomicError: after the write" in row.traceback
    assert wf.reload().status == "paused"  # the default policy applied
    assert "after the write" in wf.record.paused_reason


def test_an_atomic_body_that_raises_gets_its_policy_and_only_the_good_attempt_writes(order):
    wf = AtomicFailsThenWorks.start(order)

    first = run_next(wf)
    second = run_next(wf)

    assert (first.outcome, first.reattempt_reason) == ("reattempted", "exception_policy")
    assert second.outcome == "success"
    assert list(Receipt.objects.values_list("note", flat=True)) == ["attempt 2"]
    assert wf.status == "finished"


def test_a_database_error_in_an_atomic_body_rolls_back_and_leaves_the_connection_usable(order):
    wf = AtomicDatabaseError.start(order)

    row = run_next(wf)

    assert row.error_class == "django.db.utils.IntegrityError"
    assert (row.status, row.outcome) == ("failed", "failed")
    assert wf.status == "paused"
    assert Receipt.objects.count() == 0
    assert Order.objects.count() == 1


def test_an_atomic_body_that_succeeds_commits_one_receipt_with_its_outcome(order):
    wf = AtomicWrites.start(order)
    [claimed] = claim_due_steps(10)

    execute_step(claimed)
    execute_step(claimed)  # a second execution of the attempt is a no-op: exactly once

    receipt = Receipt.objects.get()
    row = WorkflowStep.objects.get(pk=claimed.pk)
    assert (row.status, row.outcome, row.output) == ("completed", "success", {"receipt": receipt.pk})
    assert receipt.note == "paid"
    # the body (and its receipt) ran in the transaction that wrote the step's outcome
    assert noted_transaction("atomic in_atomic_block=True") == xmin(WorkflowStep, row.pk)
    assert scheduled(wf).step_name == "plain"


def test_a_plain_body_runs_outside_any_transaction(order):
    wf = AtomicWrites.start(order)
    run_next(wf)

    row = run_next(wf)

    receipt = Receipt.objects.get(note="plain")
    assert row.output == {"receipt": receipt.pk}
    assert noted_transaction("plain in_atomic_block=False") != xmin(WorkflowStep, row.pk)
    assert list(SideEffect.objects.order_by("pk").values_list("label", flat=True)) == [
        "atomic in_atomic_block=True",
        "plain in_atomic_block=False",
    ]
    assert wf.status == "finished"


def test_an_atomic_body_that_skips_after_writing_keeps_its_write(order):
    wf = AtomicSkips.start(order)

    row = run_next(wf)

    # skip() is a decision, not a failure: only an error rolls the body back, so the receipt
    # written before skip() commits with the skipped outcome (this is what the code does).
    assert (row.status, row.outcome) == ("skipped", "skipped")
    receipt = Receipt.objects.get()
    assert receipt.note == "written before skip"
    assert noted_transaction("skip") == xmin(WorkflowStep, row.pk)
    assert wf.status == "ready"
    assert scheduled(wf).step_name == "after"


def test_a_deferred_constraint_violated_by_an_atomic_body_is_an_error_outcome(order):
    wf = AtomicDeferredConstraint.start(order)
    claimed = claim_step(scheduled(wf).pk, "test")

    execute_step(claimed)  # must not raise: the body's error goes to the policy

    row = WorkflowStep.objects.get(pk=claimed.pk)
    assert row.error_class == "django.db.utils.IntegrityError"
    assert Receipt.objects.count() == 0
    assert wf.reload().status == "paused"
