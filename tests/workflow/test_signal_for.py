"""``Cls.signal_for(subject, ...)`` when a class with ``allow_multiple`` has several ongoing runs for the subject.

It refuses (``ValueError``) and signals none, whatever ``missing`` says: which run was meant is
unknown. Each run is then signalled through its handle.
"""

import pytest

from pgbus_workflows.models import WorkflowSignal
from tests.support import run_next
from tests.testapp.child_workflows import Waiter

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("missing", ["raise", "ignore"])
def test_several_ongoing_runs_refuse_signal_for_and_none_is_signalled(order, missing):
    first, second = Waiter.start(order, n=1), Waiter.start(order, n=2)
    run_next(first)  # one waits for "go", the other is still due: both are ongoing

    with pytest.raises(ValueError, match=r"several ongoing runs .* signal one through its handle"):
        Waiter.signal_for(order, "go", {"to": "both?"}, missing=missing)
    assert WorkflowSignal.objects.count() == 0
    assert (first.reload().status, second.reload().status) == ("waiting", "ready")

    Waiter.find(first.workflow_id).signal("go", {"to": "first"})
    assert WorkflowSignal.objects.get().run_id == first.record.pk


def test_once_one_run_is_left_signal_for_signals_it(order):
    first, second = Waiter.start(order, n=1), Waiter.start(order, n=2)
    first.cancel(reason="only one is meant")
    signal = Waiter.signal_for(order, "go", {"to": "second"})
    assert signal is not None and signal.run_id == second.record.pk
