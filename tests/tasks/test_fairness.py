"""``OPTIONS["FAIRNESS"]``: a backend's tasks claimed in turn by a key read from their arguments.

Tasks go through Django's public API (``.using(backend="fair").enqueue()``); the order is read
from the real claim (``claim_due_steps``, as the dispatchers claim) or from a drain by
``run_workflow_dispatcher --once``: ordering, not timing.
"""

from contextlib import ExitStack

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.test import override_settings

from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.exceptions import ConfigurationError
from pgbus_workflows.models import TASK_CLASS_PREFIX, WorkflowStep
from pgbus_workflows.services.claims import claim_due_steps
from pgbus_workflows.tasks import runs
from pgbus_workflows.tasks.api import TaskResultStatus, task_backends
from tests.testapp import tasks
from tests.testapp.models import SideEffect

ALIAS = "fair"
BACKEND = "pgbus_workflows.tasks.WorkflowsBackend"


@pytest.fixture
def configure():
    """``configure(options)``: the alias ``fair`` with these ``OPTIONS`` from now on (again to change them).

    Its task class is forgotten afterwards, so the rest of the suite claims as a project
    without fairness does.
    """
    with ExitStack() as stack:

        def apply(options):
            stack.enter_context(
                override_settings(
                    TASKS={"default": {"BACKEND": BACKEND}, ALIAS: {"BACKEND": BACKEND, "OPTIONS": options}}
                )
            )

        yield apply
    runs._classes.pop(ALIAS, None)
    if registry.is_registered(f"{TASK_CLASS_PREFIX}{ALIAS}"):
        registry.unregister(f"{TASK_CLASS_PREFIX}{ALIAS}")


def _enqueue(account, count, by_position=False):
    task = tasks.for_account.using(backend=ALIAS)
    return [task.enqueue(account) if by_position else task.enqueue(account_id=account) for _ in range(count)]


def _claimed_keys(limit):
    return [step.fair_key for step in claim_due_steps(limit, queues=["default"], claimed_by="test")]


@pytest.mark.django_db
def test_an_account_with_few_tasks_is_claimed_in_turn_with_one_that_enqueued_many(configure):
    configure({"FAIRNESS": {"KEY": "account_id"}})
    _enqueue("a", 30)
    _enqueue("b", 3, by_position=True)  # enqueued after every task of a; the parameter read by position too

    claimed = _claimed_keys(6)

    assert sorted(claimed) == ["account_id:a"] * 3 + ["account_id:b"] * 3  # in due order: six of a
    assert claimed[:2] in (["account_id:a", "account_id:b"], ["account_id:b", "account_id:a"])


@pytest.mark.django_db
def test_weights_from_a_dotted_path_are_respected(configure):
    configure({"FAIRNESS": {"KEY": "account_id", "WEIGHT": "tests.testapp.tasks.account_weight"}})
    _enqueue("heavy-x3", 20)
    _enqueue("light", 20)

    claimed = _claimed_keys(12)

    assert (claimed.count("account_id:heavy-x3"), claimed.count("account_id:light")) == (9, 3)


@pytest.mark.django_db
def test_a_key_function_gives_the_key_and_a_task_without_one_takes_its_turn_under_its_own(configure):
    configure({"FAIRNESS": {"KEY": "tests.testapp.tasks.account_key"}})
    by_keyword = tasks.for_account.using(backend=ALIAS).enqueue(account_id=7)
    by_position = tasks.for_account.using(backend=ALIAS).enqueue(7)  # the function reads kwargs only: None
    other = tasks.add.using(backend=ALIAS).enqueue(1, 2)

    keys = {result.id: step.fair_key for result in (by_keyword, by_position, other) for step in _steps(result)}

    assert keys == {
        by_keyword.id: "account:7",
        by_position.id: "task:tests.testapp.tasks.for_account",
        other.id: "task:tests.testapp.tasks.add",
    }


@pytest.mark.django_db
def test_a_parameter_s_key_reads_its_value_as_json_its_default_and_none_as_no_account(configure):
    configure({"FAIRNESS": {"KEY": "account_id"}})
    number = tasks.for_account.using(backend=ALIAS).enqueue(account_id=7)
    none = tasks.for_account.using(backend=ALIAS).enqueue(account_id=None)
    configure({"FAIRNESS": {"KEY": "note"}})
    default = tasks.for_account.using(backend=ALIAS).enqueue("a")

    keys = [step.fair_key for result in (number, none, default) for step in _steps(result)]

    assert keys == ["account_id:7", "task:tests.testapp.tasks.for_account", "note:"]


@pytest.mark.django_db
def test_priority_comes_before_the_keys_turns(configure):
    configure({"FAIRNESS": {"KEY": "account_id"}})
    _enqueue("a", 3)
    urgent = tasks.for_account.using(backend=ALIAS, priority=10).enqueue(account_id="a")
    _enqueue("b", 1)

    [first] = claim_due_steps(1, queues=["default"], claimed_by="test")

    assert str(first.run.workflow_id) == urgent.id


def _steps(result):
    return WorkflowStep.objects.filter(run__workflow_id=result.id)


@pytest.mark.django_db(transaction=True)
def test_a_dispatcher_runs_the_accounts_tasks_in_turn(configure):
    configure({"FAIRNESS": {"KEY": "account_id"}})
    _enqueue("a", 20)
    _enqueue("b", 3)

    call_command("run_workflow_dispatcher", "--once", "--no-schedules", "--concurrency", "1")

    ran = list(SideEffect.objects.filter(label="account-task").order_by("pk").values_list("key", flat=True))
    assert sorted(ran) == ["a"] * 20 + ["b"] * 3
    last_b = max(i for i, account in enumerate(ran) if account == "b")
    assert last_b < 8, f"b's last task ran {last_b + 1}th of {len(ran)}; in due order it would be 23rd"


@pytest.mark.django_db(transaction=True)
def test_tasks_enqueued_under_fairness_still_run_once_the_option_is_removed(configure):
    configure({"FAIRNESS": {"KEY": "account_id"}})
    before = _enqueue("a", 3)
    configure({})  # the deploy that drops the option
    after = tasks.for_account.using(backend=ALIAS).enqueue(account_id="a")

    call_command("run_workflow_dispatcher", "--once", "--no-schedules")

    assert {step.fair_key for result in before for step in _steps(result)} == {"account_id:a"}
    assert [step.fair_key for step in _steps(after)] == [""]  # enqueued without fairness: no key
    for result in [*before, after]:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize(
    ("fairness", "message"),
    [
        ("account_id", "OPTIONS['FAIRNESS'] must be a dict with a 'KEY'"),
        ({"WEIGHT": "tests.testapp.tasks.account_weight"}, "OPTIONS['FAIRNESS'] needs a 'KEY'"),
        ({"KEY": "account_id", "weight": 3}, "OPTIONS['FAIRNESS'] has unknown keys ['weight']"),
        ({"KEY": "account id"}, "OPTIONS['FAIRNESS']['KEY'] must name a parameter of the tasks"),
        ({"KEY": "class"}, "OPTIONS['FAIRNESS']['KEY'] must name a parameter of the tasks"),
        ({"KEY": "account_id", "WEIGHT": 3}, "OPTIONS['FAIRNESS']['WEIGHT'] must be a function of the key"),
        ({"KEY": "tests.testapp.tasks.no_such_function"}, "tests.testapp.tasks.no_such_function does not import"),
        ({"KEY": "account_id", "WEIGHT": "tests.testapp.tasks.not_a_function"}, "not_a_function is not a function"),
    ],
)
@pytest.mark.django_db
def test_a_bad_fairness_option_fails_the_check_and_the_enqueue_and_nothing_is_written(configure, fairness, message):
    configure({"FAIRNESS": fairness})

    errors = [m for m in django_checks.run_checks() if m.id == "pgbus_workflows.E013"]
    assert len(errors) == 1 and f"TASKS['{ALIAS}']" in errors[0].msg and message in errors[0].msg
    with pytest.raises(ConfigurationError, match="OPTIONS\\['FAIRNESS'\\]"):
        tasks.for_account.using(backend=ALIAS).enqueue(account_id="a")
    assert not WorkflowStep.objects.exists()
    assert task_backends[ALIAS].check() == errors


@pytest.mark.django_db
def test_a_key_that_is_not_a_string_is_refused_at_enqueue_naming_the_task_class(configure):
    configure({"FAIRNESS": {"KEY": lambda task, args, kwargs: 42}})

    with pytest.raises(ValueError, match=r"django_task\.fair\.call: the Fairness key must be a non-empty string"):
        tasks.add.using(backend=ALIAS).enqueue(1, 2)
    assert not WorkflowStep.objects.exists()
