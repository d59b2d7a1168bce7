"""The step DSL and class validation: what a class body may say, and what it means.

Every misconfiguration raises ``ConfigurationError`` when the class is defined (docs/steps.md),
so classes that must fail are defined inside ``pytest.raises`` blocks.
"""

import os
import sys
import types
from datetime import timedelta

import pytest
from django.db.models import QuerySet

from pgbus_workflows import ConfigurationError, Job, OnException, Workflow, fan_out, removed_step, step
from pgbus_workflows.dsl.declared import registry
from pgbus_workflows.dsl.definitions import DEFAULT_STEP_MAX_REATTEMPTS, StepDefinition, resolve_policy
from pgbus_workflows.models import WorkflowStep

# -- workflows used by several tests ---------------------------------------------------------


class DefsOrder(Workflow):
    name = "defs_order_steps"

    @step
    def charlie(self):
        return 1

    def helper(self):
        """A plain method: not a step."""
        return 2

    @step()
    def alpha(self):
        return 3

    @step(wait=30)
    def bravo(self):
        return 4


class DefsParent(Workflow):
    name = "defs_parent"

    @step
    def first(self):
        return "parent first"

    @step
    def second(self):
        return "parent second"

    @step
    def third(self):
        return "parent third"


class DefsChild(DefsParent):
    name = "defs_child"

    @step
    def fourth(self):
        return "child fourth"

    @step(queue="child")
    def second(self):
        return "child second"


class DefsGravestones(Workflow):
    name = "defs_gravestones"

    @step
    def first(self):
        return None

    old_reminder = removed_step()

    @step
    def last(self):
        return None


# -- the step options ----------------------------------------------------------------------


def test_unknown_step_option_is_refused():
    with pytest.raises(ConfigurationError, match=r"Unknown step option\(s\): retries"):

        class BadOption(Workflow):
            abstract = True

            @step(retries=3)
            def one(self):
                return None


def test_every_unknown_option_is_named():
    with pytest.raises(ConfigurationError, match=r"Unknown step option\(s\): colour, retries"):
        step(retries=3, colour="red")


@pytest.mark.parametrize("action", ["explode", "retry", "pause!", ""])
def test_unknown_on_exception_action_is_refused(action):
    with pytest.raises(ConfigurationError, match=rf"Unknown on_exception {action!r}"):

        class BadAction(Workflow):
            abstract = True

            @step(on_exception=action)
            def one(self):
                return None


def test_unknown_on_exception_action_in_a_policy_is_refused():
    with pytest.raises(ConfigurationError, match=r"Unknown exception action 'explode'"):
        OnException(ValueError, action="explode")


@pytest.mark.parametrize("wait", [-1, -0.5, timedelta(seconds=-5)])
def test_negative_wait_is_refused(wait):
    with pytest.raises(ConfigurationError, match=r"wait must not be negative"):

        class NegativeWait(Workflow):
            abstract = True

            @step(wait=wait)
            def one(self):
                return None


@pytest.mark.parametrize("wait", ["5 minutes", "30", True, [1], object()])
def test_wait_that_is_not_a_duration_is_refused(wait):
    with pytest.raises(ConfigurationError, match=r"wait must be a timedelta or a number of seconds"):

        class NotADuration(Workflow):
            abstract = True

            @step(wait=wait)
            def one(self):
                return None


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("timeout", -1, r"timeout must not be negative"),
        ("timeout", "1h", r"timeout must be a timedelta or a number of seconds"),
        ("skip_if", 3, r"skip_if must be a callable, a method name, a bool or None"),
        ("priority", "high", r"priority must be an integer"),
        ("priority", True, r"priority must be an integer"),
        ("queue", "", r"queue must be a non-empty string"),
        ("queue", 7, r"queue must be a non-empty string"),
        ("wait_for", ["paid", ""], r"wait_for must be a signal name or a list of names"),
    ],
)
def test_bad_step_option_values_are_refused(option, value, message):
    with pytest.raises(ConfigurationError, match=message):

        class BadValue(Workflow):
            abstract = True

            @step(**{option: value})
            def one(self):
                return None


def test_wait_for_that_is_not_a_name_or_a_list_is_refused():
    with pytest.raises(ConfigurationError, match=r"wait_for must be a signal name or a list of names"):

        class WaitForNumber(Workflow):
            abstract = True

            @step(wait_for=5)
            def one(self):
                return None


def test_wait_accepts_seconds_a_timedelta_or_a_callable():
    def backoff(attempt):
        return attempt * 10

    class Waits(Workflow):
        abstract = True

        @step(wait=90)
        def seconds(self):
            return None

        @step(wait=timedelta(hours=1))
        def delta(self):
            return None

        @step(wait=backoff)
        def computed(self):
            return None

        @step(wait=0)
        def zero(self):
            return None

    assert Waits.step_definition("seconds").wait == timedelta(seconds=90)
    assert Waits.step_definition("delta").wait == timedelta(hours=1)
    assert Waits.step_definition("computed").wait is backoff
    assert Waits.step_definition("zero").wait == timedelta(0)


def test_max_reattempts_without_reattempt_is_refused():
    with pytest.raises(ConfigurationError, match=r"max_reattempts= needs on_exception='reattempt'"):

        class NoAction(Workflow):
            abstract = True

            @step(max_reattempts=3)
            def one(self):
                return None


@pytest.mark.parametrize("action", ["pause", "cancel", "skip"])
def test_max_reattempts_with_another_action_is_refused(action):
    with pytest.raises(ConfigurationError, match=rf"max_reattempts= needs on_exception='reattempt', not '{action}'"):

        class OtherAction(Workflow):
            abstract = True

            @step(on_exception=action, max_reattempts=3)
            def one(self):
                return None


def test_max_reattempts_on_the_step_with_a_policy_object_is_refused():
    policy = OnException(ConnectionError, action="reattempt", max_reattempts=2)
    with pytest.raises(ConfigurationError, match=r"max_reattempts= goes on the OnException policy, not on the step"):

        class Both(Workflow):
            abstract = True

            @step(on_exception=policy, max_reattempts=5)
            def one(self):
                return None


@pytest.mark.parametrize("value", [0, -1, "3", 2.5, True, False])
def test_bad_max_reattempts_values_are_refused(value):
    with pytest.raises(ConfigurationError, match=r"max_reattempts must be a positive integer"):

        class BadMax(Workflow):
            abstract = True

            @step(on_exception="reattempt", max_reattempts=value)
            def one(self):
                return None

    with pytest.raises(ConfigurationError, match=r"max_reattempts must be a positive integer"):
        OnException(ValueError, action="reattempt", max_reattempts=value)


@pytest.mark.parametrize("action", ["pause", "cancel", "skip"])
def test_on_exception_max_reattempts_needs_reattempt(action):
    with pytest.raises(ConfigurationError, match=rf"max_reattempts= only goes with action='reattempt', not '{action}'"):
        OnException(ValueError, action=action, max_reattempts=3)


@pytest.mark.parametrize("action", ["pause", "cancel", "skip"])
def test_on_exception_wait_needs_reattempt(action):
    with pytest.raises(ConfigurationError, match=rf"wait= only goes with action='reattempt', not '{action}'"):
        OnException(ValueError, action=action, wait=timedelta(seconds=5))


def test_on_exception_wait_must_be_a_non_negative_duration():
    with pytest.raises(ConfigurationError, match=r"OnException wait must not be negative"):
        OnException(ValueError, action="reattempt", wait=-5)
    with pytest.raises(ConfigurationError, match=r"OnException wait must be a timedelta or a number of seconds"):
        OnException(ValueError, action="reattempt", wait="soon")
    policy = OnException(ValueError, action="reattempt", wait=15)
    assert policy.wait == timedelta(seconds=15)


@pytest.mark.parametrize("terminal", ["skip", "reattempt", "explode", None])
def test_bad_terminal_action_is_refused(terminal):
    with pytest.raises(ConfigurationError, match=r"terminal_action must be 'pause' or 'cancel'"):
        OnException(ValueError, action="reattempt", max_reattempts=3, terminal_action=terminal)


def test_terminal_action_cancel_needs_reattempt():
    with pytest.raises(ConfigurationError, match=r"terminal_action= only goes with action='reattempt'"):
        OnException(ValueError, action="pause", terminal_action="cancel")
    policy = OnException(ValueError, action="reattempt", max_reattempts=3, terminal_action="cancel")
    assert policy.terminal_action == "cancel"


@pytest.mark.parametrize("matcher", [int, object, ValueError("an instance, not a class"), 42, None])
def test_on_exception_takes_only_exception_classes_or_dotted_names(matcher):
    with pytest.raises(ConfigurationError, match=r"OnException takes exception classes or dotted names"):
        OnException(matcher, action="cancel")


def test_fan_out_refuses_step_options_that_do_not_apply_and_bad_job_options():
    with pytest.raises(ConfigurationError, match=r"Unknown fan_out option\(s\): wait_for"):
        fan_out(wait_for="x")(lambda self: [])
    with pytest.raises(ConfigurationError, match=r"max_attempts must be a positive integer, got 0"):
        fan_out(max_attempts=0)(lambda self: [])
    with pytest.raises(ConfigurationError, match=r"on_job_failure must be 'fail' or 'continue', got 'ignore'"):
        fan_out(on_job_failure="ignore")(lambda self: [])


def test_a_job_must_be_a_module_level_function_of_an_installed_app():
    def local():
        return 1

    with pytest.raises(ConfigurationError, match=r"must be a plain function, got <built-in function print>"):
        Job(print, 1)
    with pytest.raises(ConfigurationError, match=r"must be a module-level function, not .*local"):
        Job(local)
    with pytest.raises(ConfigurationError, match=r"posixpath.join is not in an installed app"):
        Job(os.path.join, "a")


def test_wait_timeout_or_on_timeout_without_wait_for_is_refused():
    with pytest.raises(ConfigurationError, match=r"wait_timeout= and on_timeout= need wait_for="):

        class TimeoutOnly(Workflow):
            abstract = True

            @step(wait_timeout=timedelta(hours=1))
            def one(self):
                return None

    with pytest.raises(ConfigurationError, match=r"wait_timeout= and on_timeout= need wait_for="):

        class OnTimeoutOnly(Workflow):
            abstract = True

            @step(on_timeout="cancel")
            def one(self):
                return None


def test_wait_for_options_are_checked():
    with pytest.raises(ConfigurationError, match=r"Unknown on_timeout 'explode'"):

        class BadOnTimeout(Workflow):
            abstract = True

            @step(wait_for="paid", on_timeout="explode")
            def one(self):
                return None

    with pytest.raises(ConfigurationError, match=r"A wait_for step cannot be atomic=True"):

        class AtomicWait(Workflow):
            abstract = True

            @step(wait_for="paid", atomic=True)
            def one(self):
                return None

    class Waits(Workflow):
        abstract = True

        @step(wait_for="paid", wait_timeout=3600, on_timeout="cancel")
        def single(self):
            return None

        @step(wait_for=["a", "b"])
        def several(self):
            return None

    assert Waits.step_definition("single").wait_for == ("paid",)
    assert Waits.step_definition("single").wait_timeout == timedelta(hours=1)
    assert Waits.step_definition("single").on_timeout == "cancel"
    assert Waits.step_definition("several").wait_for == ("a", "b")
    assert Waits.step_definition("several").on_timeout == "pause"


# -- class-level validation -------------------------------------------------------------------


def test_duplicate_step_name_in_one_class_body_is_refused():
    with pytest.raises(ConfigurationError, match=r"Step 'reserve' is already defined in DupSteps"):

        class DupSteps(Workflow):
            name = "defs_dup_steps"

            @step
            def reserve(self):
                return 1

            @step(wait=5)
            def reserve(self):  # noqa: F811 - the point of the test
                return 2

    assert not registry.is_registered("defs_dup_steps")


def test_a_step_cannot_take_the_name_of_a_gravestone():
    with pytest.raises(ConfigurationError, match=r"Step 'old' is already defined in ReusesGravestone"):

        class ReusesGravestone(Workflow):
            abstract = True

            old = removed_step()

            @step
            def old(self):  # noqa: F811 - the point of the test
                return None


@pytest.mark.parametrize(
    "policies",
    [
        [ValueError],
        [OnException(ValueError, action="cancel"), "pause"],
        OnException(ValueError, action="cancel"),
        {"ValueError": "cancel"},
        "pause",
    ],
)
def test_exception_policies_must_be_a_list_of_on_exception(policies):
    with pytest.raises(ConfigurationError, match=r"BadPolicies\.exception_policies must be a list of OnException"):

        class BadPolicies(Workflow):
            name = "defs_bad_policies"
            exception_policies = policies

    assert not registry.is_registered("defs_bad_policies")


@pytest.mark.parametrize("options", [{"wait": 5}, {"queue": "q", "timeout": 10}, {"Queue": "q"}, ["queue"]])
def test_step_options_take_only_queue_and_priority(options):
    with pytest.raises(ConfigurationError, match=r"BadStepOptions\.step_options takes only 'queue' and 'priority'"):

        class BadStepOptions(Workflow):
            abstract = True
            step_options = options


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": "high"}, r"step_options\['priority'\] must be an integer, got 'high'"),
        ({"priority": True}, r"step_options\['priority'\] must be an integer, got True"),
        ({"queue": ""}, r"step_options\['queue'\] must be a non-empty string, got ''"),
        ({"queue": 7}, r"step_options\['queue'\] must be a non-empty string, got 7"),
    ],
)
def test_step_options_values_are_checked_like_the_step_options(options, message):
    with pytest.raises(ConfigurationError, match=rf"BadStepOptionValues\.{message}"):

        class BadStepOptionValues(Workflow):
            abstract = True
            step_options = options


@pytest.mark.parametrize("bad_name", ["", 42, "x" * 256])
def test_workflow_name_must_be_a_short_string(bad_name):
    with pytest.raises(ConfigurationError, match=r"BadName\.name must be a non-empty string of at most 255"):

        class BadName(Workflow):
            name = bad_name


def test_step_decorates_only_callables():
    with pytest.raises(ConfigurationError, match=r"@step decorates a method"):
        step(queue="q")(42)


# -- order, inheritance, gravestones ---------------------------------------------------------


def test_steps_run_in_definition_order():
    assert [s.name for s in DefsOrder.steps()] == ["charlie", "alpha", "bravo"]
    assert all(isinstance(s, StepDefinition) for s in DefsOrder.steps())
    assert DefsOrder.next_step_after(None).name == "charlie"
    assert DefsOrder.next_step_after("charlie").name == "alpha"
    assert DefsOrder.next_step_after("alpha").name == "bravo"
    assert DefsOrder.next_step_after("bravo") is None


def test_a_decorated_step_is_still_callable_on_an_instance():
    assert DefsOrder.bravo.name == "bravo"
    assert DefsOrder.bravo.wait == timedelta(seconds=30)
    handle = DefsOrder.__new__(DefsOrder)
    assert handle.charlie() == 1
    assert handle.helper() == 2


def test_a_subclass_inherits_steps_and_a_redefinition_keeps_its_place():
    assert [s.name for s in DefsParent.steps()] == ["first", "second", "third"]
    assert [s.name for s in DefsChild.steps()] == ["first", "second", "third", "fourth"]
    child_second = DefsChild.step_definition("second")
    assert child_second.queue == "child"
    assert child_second.func(None) == "child second"
    # the parent is untouched
    assert DefsParent.step_definition("second").queue is None
    assert DefsParent.step_definition("second").func(None) == "parent second"
    # inherited steps are the parent's own definitions
    assert DefsChild.step_definition("first") is DefsParent.step_definition("first")
    assert DefsChild.next_step_after("third").name == "fourth"


def test_a_subclass_can_redefine_a_parent_step_without_a_duplicate_error():
    class Grandchild(DefsChild):
        abstract = True

        @step(priority=9)
        def first(self):
            return "grandchild first"

    assert [s.name for s in Grandchild.steps()] == ["first", "second", "third", "fourth"]
    assert Grandchild.step_definition("first").priority == 9
    assert Grandchild.step_definition("second").queue == "child"


def test_removed_step_keeps_its_name_and_is_left_out_of_steps():
    gravestone = DefsGravestones.step_definition("old_reminder")
    assert gravestone is not None
    assert gravestone.name == "old_reminder"
    assert gravestone.removed
    assert gravestone.func is None
    assert DefsGravestones.old_reminder.name == "old_reminder"
    assert [s.name for s in DefsGravestones.steps()] == ["first", "last"]
    assert DefsGravestones.removed_step_names() == ("old_reminder",)
    assert DefsGravestones.next_step_after("first").name == "last"
    # a run parked on the gravestone moves on to the next live step
    assert DefsGravestones.next_step_after("old_reminder").name == "last"


def test_one_removed_step_object_can_name_gravestones_in_two_classes():
    shared = removed_step()

    class A(Workflow):
        abstract = True
        gone_a = shared

    class B(Workflow):
        abstract = True
        gone_b = shared

    assert A.removed_step_names() == ("gone_a",)
    assert B.removed_step_names() == ("gone_b",)


@pytest.mark.django_db
def test_cls_steps_are_definitions_and_handle_steps_are_rows(order):
    definitions = DefsOrder.steps()
    assert isinstance(definitions, tuple)
    assert [d.name for d in definitions] == ["charlie", "alpha", "bravo"]

    wf = DefsOrder.start(order)
    rows = wf.steps
    assert isinstance(rows, QuerySet)
    assert rows.model is WorkflowStep
    assert [(r.step_name, r.attempt, r.status) for r in rows] == [("charlie", 1, "scheduled")]
    # the class attribute keeps giving definitions after a handle exists
    assert DefsOrder.steps() == definitions


@pytest.mark.django_db
def test_a_run_starts_at_the_first_live_step_past_gravestones(order):
    class GravestoneFirst(Workflow):
        name = "defs_gravestone_first"
        gone = removed_step()

        @step
        def live(self):
            return None

    try:
        wf = GravestoneFirst.start(order)
        assert wf.current_step == "live"
        assert [s.step_name for s in wf.steps] == ["live"]
        assert GravestoneFirst.removed_steps_in_flight() == {"gone": 0}
    finally:
        registry.unregister("defs_gravestone_first")


# -- exception policies ------------------------------------------------------------------------


def test_default_max_reattempts_is_100_for_on_exception_reattempt():
    class Reattempts(Workflow):
        abstract = True

        @step(on_exception="reattempt")
        def default(self):
            return None

        @step(on_exception="reattempt", max_reattempts=3)
        def three(self):
            return None

        @step(on_exception="reattempt", max_reattempts=None)
        def unlimited(self):
            return None

    default = Reattempts.step_definition("default").on_exception
    assert DEFAULT_STEP_MAX_REATTEMPTS == 100
    assert default.action == "reattempt"
    assert default.max_reattempts == 100
    assert default.terminal_action == "pause"
    assert default.is_blanket
    assert Reattempts.step_definition("three").on_exception.max_reattempts == 3
    assert Reattempts.step_definition("unlimited").on_exception.max_reattempts is None
    # a class-level policy gets no default (spec 1.4)
    assert OnException(action="reattempt").max_reattempts is None


@pytest.mark.parametrize("action", ["pause", "cancel", "skip"])
def test_a_step_action_string_becomes_a_blanket_policy(action):
    class WithAction(Workflow):
        abstract = True

        @step(on_exception=action)
        def one(self):
            return None

    policy = WithAction.step_definition("one").on_exception
    assert isinstance(policy, OnException)
    assert policy.action == action
    assert policy.is_blanket
    assert policy.max_reattempts is None


def test_a_step_without_on_exception_has_no_own_policy():
    assert DefsOrder.step_definition("alpha").on_exception is None


class DefsPolicyParent(Workflow):
    name = "defs_policy_parent"
    exception_policies = [
        OnException(LookupError, action="cancel"),
        OnException(KeyError, action="skip"),
        OnException(action="reattempt", wait=5),
    ]

    @step
    def plain(self):
        return None

    @step(on_exception="skip")
    def own_action(self):
        return None

    @step(on_exception=OnException(ValueError, action="reattempt", max_reattempts=2, terminal_action="cancel"))
    def own_policy(self):
        return None


class DefsPolicyChild(DefsPolicyParent):
    name = "defs_policy_child"
    exception_policies = [
        OnException(IndexError, action="reattempt", max_reattempts=7),
        OnException(action="pause"),
    ]


class DefsPolicyGrandchild(DefsPolicyChild):
    """Declares no policies of its own: it uses its parents'."""

    name = "defs_policy_grandchild"


class DefsNoPolicies(Workflow):
    name = "defs_no_policies"

    @step
    def plain(self):
        return None


def _plain(cls):
    return cls.step_definition("plain")


def test_the_step_s_own_policy_wins():
    own = DefsPolicyParent.step_definition("own_action")
    assert resolve_policy(DefsPolicyParent, own, KeyError("k")).action == "skip"
    assert resolve_policy(DefsPolicyParent, own, RuntimeError("x")).action == "skip"
    own_policy = DefsPolicyParent.step_definition("own_policy")
    chosen = resolve_policy(DefsPolicyParent, own_policy, ValueError("v"))
    assert chosen is own_policy.on_exception
    assert (chosen.action, chosen.max_reattempts, chosen.terminal_action) == ("reattempt", 2, "cancel")
    # in a subclass too
    assert resolve_policy(DefsPolicyChild, own, IndexError("i")).action == "skip"


def test_class_policies_newest_first():
    # KeyError matches both LookupError (older) and KeyError (newer): the newer wins
    assert resolve_policy(DefsPolicyParent, _plain(DefsPolicyParent), KeyError("k")).action == "skip"
    # IndexError matches only LookupError
    assert resolve_policy(DefsPolicyParent, _plain(DefsPolicyParent), IndexError("i")).action == "cancel"


def test_a_subclass_policy_comes_before_its_parents():
    chosen = resolve_policy(DefsPolicyChild, _plain(DefsPolicyChild), IndexError("i"))
    assert (chosen.action, chosen.max_reattempts) == ("reattempt", 7)
    # the parent's specific policies still apply to what the child does not name
    assert resolve_policy(DefsPolicyChild, _plain(DefsPolicyChild), KeyError("k")).action == "skip"
    # and the parent itself is unchanged
    assert resolve_policy(DefsPolicyParent, _plain(DefsPolicyParent), IndexError("i")).action == "cancel"


def test_a_subclass_without_policies_uses_its_parents():
    chosen = resolve_policy(DefsPolicyGrandchild, _plain(DefsPolicyGrandchild), IndexError("i"))
    assert (chosen.action, chosen.max_reattempts) == ("reattempt", 7)


def test_specific_policies_come_before_blanket_ones():
    # the child's blanket pause is newer than the parent's LookupError policy, but specific wins
    assert resolve_policy(DefsPolicyChild, _plain(DefsPolicyChild), LookupError("l")).action == "cancel"


def test_the_newest_blanket_policy_applies_when_no_specific_one_matches():
    # child: its own blanket (pause) before the parent's (reattempt)
    assert resolve_policy(DefsPolicyChild, _plain(DefsPolicyChild), RuntimeError("r")).action == "pause"
    parent = resolve_policy(DefsPolicyParent, _plain(DefsPolicyParent), RuntimeError("r"))
    assert (parent.action, parent.wait) == ("reattempt", timedelta(seconds=5))

    class TwoBlankets(Workflow):
        abstract = True
        exception_policies = [OnException(action="cancel"), OnException(action="skip")]

    assert resolve_policy(TwoBlankets, None, RuntimeError("r")).action == "skip"


def test_default_is_pause():
    chosen = resolve_policy(DefsNoPolicies, _plain(DefsNoPolicies), RuntimeError("boom"))
    assert chosen.action == "pause"
    assert chosen.is_blanket
    assert resolve_policy(DefsNoPolicies, None, ValueError("no definition")).action == "pause"


def test_a_policy_matches_subclasses_of_its_exceptions():
    policy = OnException(OSError, action="cancel")
    assert policy.matches(ConnectionError())
    assert policy.matches(OSError())
    assert not policy.matches(ValueError())
    assert OnException(action="skip").matches(ValueError())


def test_dotted_exception_names_match():
    policy = OnException("builtins.ConnectionError", action="cancel")
    assert policy.matches(ConnectionRefusedError())
    assert not policy.matches(ValueError())
    assert not policy.is_blanket


@pytest.mark.parametrize(
    "dotted",
    [
        "no_such_package.errors.Gone",
        "tests.testapp.workflows.NoSuchError",
        "NoDotsAtAll",
        "os.getcwd",  # exists, but is not an exception class
    ],
)
def test_a_missing_dotted_name_matches_nothing(dotted):
    class MissingName(Workflow):
        abstract = True
        exception_policies = [OnException(action="skip"), OnException(dotted, action="cancel")]

    assert not MissingName.exception_policies[1].matches(ValueError("x"))
    # the blanket policy takes it instead
    assert resolve_policy(MissingName, None, ValueError("x")).action == "skip"


def test_dotted_exception_names_resolve_lazily(monkeypatch):
    module_name = "defs_lazy_errors_module"
    monkeypatch.delitem(sys.modules, module_name, raising=False)

    class LazyName(Workflow):
        abstract = True
        exception_policies = [OnException(f"{module_name}.LateError", action="cancel")]

    class LateError(Exception):
        pass

    # the module does not exist yet: defining the class worked, matching finds nothing
    assert resolve_policy(LazyName, None, LateError()).action == "pause"

    module = types.ModuleType(module_name)
    module.LateError = LateError
    monkeypatch.setitem(sys.modules, module_name, module)
    assert resolve_policy(LazyName, None, LateError()).action == "cancel"
    assert resolve_policy(LazyName, None, ValueError()).action == "pause"


class DefsFlaky(Exception):
    """Named by its dotted path in a policy."""


def test_an_exception_of_a_test_module_resolves_by_dotted_name():
    class ByName(Workflow):
        abstract = True
        exception_policies = [OnException("tests.dsl.test_definitions.DefsFlaky", action="skip")]

    assert resolve_policy(ByName, None, DefsFlaky("x")).action == "skip"
    assert resolve_policy(ByName, None, RuntimeError("x")).action == "pause"


@pytest.mark.parametrize("reserved", ["pause", "cancel", "start", "signal", "subject", "reload"])
def test_a_step_may_not_hide_a_workflow_method(reserved):
    namespace = {"name": f"defs_reserved_{reserved}", reserved: step(lambda self: None)}
    with pytest.raises(ConfigurationError, match=f"Step '{reserved}' in DefsReserved would hide Workflow.{reserved}"):
        type(Workflow)("DefsReserved", (Workflow,), namespace)
