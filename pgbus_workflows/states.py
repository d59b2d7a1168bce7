"""Statuses and the transition tables: the only moves a run or a step may make.

Every change of a run's status goes through :func:`check_run_transition`, named as in
pgbus, so the audit trail of a run is a path through :data:`RUN_TRANSITIONS`; which operator
verbs a run may take is :func:`allowed_verbs` (the admin's buttons ask it, and the property
test checks that the services agree with it).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models
from django.utils.translation import gettext_lazy as _

from .exceptions import InvalidTransition


class RunStatus(models.TextChoices):
    """Where a run is."""

    READY = "ready", _("ready")
    PERFORMING = "performing", _("performing")
    WAITING = "waiting", _("waiting")
    PAUSED = "paused", _("paused")
    FINISHED = "finished", _("finished")
    CANCELLED = "cancelled", _("cancelled")


class StepStatus(models.TextChoices):
    """Where one attempt of a step is."""

    SCHEDULED = "scheduled", _("scheduled")
    IN_PROGRESS = "in_progress", _("in progress")
    WAITING = "waiting", _("waiting")
    COMPLETED = "completed", _("completed")
    FAILED = "failed", _("failed")
    SKIPPED = "skipped", _("skipped")
    CANCELLED = "cancelled", _("cancelled")


class StepOutcomeKind(models.TextChoices):
    """What an attempt caused (stored on the step row as ``outcome``)."""

    SUCCESS = "success", _("success")
    REATTEMPTED = "reattempted", _("reattempted")
    SKIPPED = "skipped", _("skipped")
    PAUSED = "paused", _("paused")
    CANCELLED = "cancelled", _("cancelled")
    FAILED = "failed", _("failed")
    STALLED = "stalled", _("stalled")
    TIMED_OUT = "timed_out", _("timed out")


ONGOING_RUN = frozenset({RunStatus.READY, RunStatus.PERFORMING, RunStatus.WAITING, RunStatus.PAUSED})
TERMINAL_RUN = frozenset({RunStatus.FINISHED, RunStatus.CANCELLED})
ACTIVE_STEP = frozenset({StepStatus.SCHEDULED, StepStatus.IN_PROGRESS, StepStatus.WAITING})

_R = RunStatus

#: transition name -> the (from, to) status pairs it allows.
RUN_TRANSITIONS: dict[str, frozenset[tuple[str, str]]] = {
    # a dispatcher claimed the run's due step
    "claim": frozenset({(_R.READY, _R.PERFORMING)}),
    # the attempt ended and the next attempt (or step) is scheduled
    "advance": frozenset({(_R.PERFORMING, _R.READY), (_R.READY, _R.READY)}),
    # no step is left, or the body called finished()
    "finish": frozenset({(s, _R.FINISHED) for s in (_R.PERFORMING, _R.READY, _R.PAUSED)}),
    # the next step waits for a signal or a fan-out
    "park": frozenset({(_R.PERFORMING, _R.WAITING), (_R.READY, _R.WAITING)}),
    # a signal (or an on_timeout="run") scheduled the waiting step
    "wake": frozenset({(_R.WAITING, _R.READY)}),
    # a waiting step is resolved (fan-out done, timeout, skip): its outcome applies next
    "resolve": frozenset({(_R.WAITING, _R.PERFORMING)}),
    # the run stays paused while its step row moves, or an error paused it
    "hold": frozenset({(_R.PERFORMING, _R.PAUSED), (_R.PAUSED, _R.PAUSED)}),
    # the body called pause()
    "step_pause": frozenset({(_R.PERFORMING, _R.PAUSED)}),
    # an operator paused the run
    "pause": frozenset({(s, _R.PAUSED) for s in (_R.READY, _R.WAITING, _R.PERFORMING)}),
    # an operator resumed it: back to what its active step says
    "resume": frozenset({(_R.PAUSED, s) for s in (_R.READY, _R.WAITING, _R.PERFORMING)}),
    "cancel": frozenset({(s, _R.CANCELLED) for s in (_R.READY, _R.WAITING, _R.PAUSED, _R.PERFORMING)}),
}

#: Transitions a step's move makes of its run. On a paused run the step still moves, but
#: the run stays paused: the move is recorded as ``hold`` (nothing runs until ``resume()``).
HELD_WHILE_PAUSED = frozenset({"advance", "park", "wake", "step_pause"})


def unless_paused(transition: str, source: str, target: str) -> tuple[str, str]:
    """The transition and target a run in ``source`` takes: ``hold`` when a pause holds it."""
    if source == RunStatus.PAUSED and transition in HELD_WHILE_PAUSED:
        return "hold", RunStatus.PAUSED
    return transition, target


_S = StepStatus

#: attempt event -> (the statuses it may come from, the status it goes to). Every move of an
#: attempt names its event; an attempt is created scheduled (or in progress: a chained claim).
STEP_EVENTS: dict[str, tuple[frozenset[str], str]] = {
    "claim": (frozenset({_S.SCHEDULED}), _S.IN_PROGRESS),  # a dispatcher (or a test helper) takes it
    "unclaim": (frozenset({_S.IN_PROGRESS}), _S.SCHEDULED),  # a chained claim its run could not take
    "park": (frozenset({_S.IN_PROGRESS}), _S.WAITING),  # it waits for a signal or its fan-out's jobs
    "wake": (frozenset({_S.WAITING}), _S.SCHEDULED),  # a signal came, or the wait ended with on_timeout="run"
    "resolve": (frozenset({_S.WAITING}), _S.IN_PROGRESS),  # the wait ends with an outcome, applied next
    "complete": (frozenset({_S.IN_PROGRESS}), _S.COMPLETED),
    "fail": (frozenset({_S.IN_PROGRESS}), _S.FAILED),
    "skip": (frozenset({_S.IN_PROGRESS, _S.SCHEDULED, _S.WAITING}), _S.SKIPPED),
    "cancel": (frozenset({_S.IN_PROGRESS, _S.SCHEDULED, _S.WAITING}), _S.CANCELLED),
}


class JobStatus(models.TextChoices):
    """Where one fan-out job is."""

    PENDING = "pending", _("pending")
    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


class SignalStatus(models.TextChoices):
    """Whether a signal is still to be consumed."""

    PENDING = "pending", _("pending")
    CONSUMED = "consumed", _("consumed")


_J = JobStatus

#: fan-out job event -> (from, to). Every job write is a compare-and-set on ``from``
#: (``UPDATE ... WHERE status = from``): a job another writer moved first is left alone.
JOB_EVENTS: dict[str, tuple[str, str]] = {
    "claim": (_J.PENDING, _J.RUNNING),  # a dispatcher starts an attempt
    "succeed": (_J.RUNNING, _J.SUCCEEDED),
    "fail": (_J.RUNNING, _J.FAILED),  # attempts spent, or the fan-out ended
    "retry": (_J.RUNNING, _J.PENDING),  # after the backoff, the attempt counted
    "put_back": (_J.RUNNING, _J.PENDING),  # stalled or its dispatcher died: the attempt not counted
    "cancel": (_J.PENDING, _J.CANCELLED),  # its fan-out step ended before it started
}

#: signal event -> (from, to), under the run's lock.
SIGNAL_EVENTS: dict[str, tuple[str, str]] = {
    "consume": (SignalStatus.PENDING, SignalStatus.CONSUMED),  # a waiting step takes it
    "return": (SignalStatus.CONSUMED, SignalStatus.PENDING),  # the attempt that took it never ran its body
}


def job_event(event: str) -> tuple[str, str]:
    """``(from, to)`` of a fan-out job event; raises :class:`InvalidTransition` for an unknown one."""
    try:
        return JOB_EVENTS[event]
    except KeyError:
        raise InvalidTransition(f"Unknown fan-out job event {event!r}") from None


def signal_event(event: str, source: str) -> str:
    """The status a signal in ``source`` takes on ``event``; raises :class:`InvalidTransition` otherwise."""
    expected, target = SIGNAL_EVENTS.get(event, ("", ""))
    if source != expected:
        raise InvalidTransition(f"A {source} signal cannot {event} (it must be {expected or 'nothing'})")
    return target


#: The verb users read in messages ("Cannot pause a finished workflow").
_VERBS = {"step_pause": "pause", "hold": "hold"}


def check_run_transition(transition: str, source: str, target: str) -> None:
    """Raise :class:`InvalidTransition` unless ``transition`` allows ``source -> target``."""
    allowed = RUN_TRANSITIONS.get(transition)
    if allowed is None:
        raise InvalidTransition(f"Unknown transition {transition!r}")
    if (source, target) not in allowed:
        verb = _VERBS.get(transition, transition)
        raise InvalidTransition(f"Cannot {verb} a {source} workflow (transition {transition!r} to {target})")


def step_event(event: str, source: str) -> str:
    """The status an attempt in ``source`` takes on ``event``; raises :class:`InvalidTransition` otherwise."""
    sources, target = STEP_EVENTS.get(event, (frozenset(), ""))
    if source not in sources:
        raise InvalidTransition(f"A {source} step cannot {event}")
    return target


@dataclass(frozen=True)
class RunFacts:
    """What decides which operator verbs a run may take now (read under its lock, or for display)."""

    status: str
    #: The status of its active attempt (scheduled, in progress, waiting), or None.
    active_status: str | None = None
    #: The active attempt is scheduled for later (``run_now`` has a wait to cut short).
    active_due_later: bool = False
    #: The active attempt waits for a signal (not for a fan-out).
    active_waits_for_signal: bool = False
    #: The run's class is registered in this process.
    class_known: bool = True
    #: The class defines (or keeps a gravestone or an old name for) the step of the active or last attempt.
    current_step_known: bool = True
    #: The class has a live step to ``resume_at``.
    class_has_steps: bool = True
    #: Some step of the class waits for a signal, or it lists ``extra_signals`` (or the class is unknown).
    takes_signals: bool = True


def allowed_verbs(facts: RunFacts) -> frozenset[str]:
    """The operator verbs a run in this state may take: the services refuse the others.

    ``resume_at``, ``rerun`` and ``fork`` may still be refused for a reason that is not the run's
    state (an unknown step name; an ongoing run of the same subject, or a deleted subject).
    """
    status, active = facts.status, facts.active_status
    ongoing = status in ONGOING_RUN
    verbs = set()
    if status in (RunStatus.READY, RunStatus.WAITING, RunStatus.PERFORMING):
        verbs.add("pause")
    if status == RunStatus.PAUSED:
        if active is not None or facts.current_step_known:
            verbs.add("resume")
        if facts.class_has_steps:
            verbs.add("resume_at")
    if ongoing:
        verbs.add("cancel")
        if facts.takes_signals:
            verbs.add("signal")
        if (active == StepStatus.SCHEDULED and facts.active_due_later) or (
            active == StepStatus.WAITING and facts.active_waits_for_signal
        ):
            verbs.add("run_now")
    if status in (RunStatus.READY, RunStatus.PAUSED, RunStatus.WAITING) and active in (
        None,
        StepStatus.SCHEDULED,
        StepStatus.WAITING,
    ):
        if (status == RunStatus.WAITING and active is not None) or facts.current_step_known:
            verbs.add("skip")
    if status in TERMINAL_RUN and facts.class_known:
        verbs.add("rerun")
    if facts.class_has_steps:
        verbs.add("fork")
    return frozenset(verbs)


class ScheduleEventKind(models.TextChoices):
    """What a line of a schedule's audit trail records."""

    CREATED = "created", _("created")
    CHANGED = "changed", _("changed in code")
    PAUSED = "paused", _("paused")
    RESUMED = "resumed", _("resumed")
    FIRED_NOW = "fired_now", _("fired now")
    TICK_SKIPPED = "tick_skipped", _("tick skipped (overlap)")
    TICKS_MISSED = "ticks_missed", _("ticks missed (catch-up)")
    PREVIOUS_CANCELLED = "previous_cancelled", _("previous run cancelled")
    TICK_FAILED = "tick_failed", _("tick failed")


def allowed_schedule_verbs(*, paused: bool, enabled: bool, class_known: bool) -> frozenset[str]:
    """The operator verbs a schedule may take: ``pause`` when running, ``resume`` when paused,
    ``fire_now`` while its class is registered (paused or not: an operator may fire by hand).

    A schedule disabled in code (``enabled=False``) fires only by hand: pausing it adds nothing.
    """
    verbs = {"resume"} if paused else ({"pause"} if enabled else set())
    if class_known:
        verbs.add("fire_now")
    return frozenset(verbs)
