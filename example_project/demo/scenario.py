"""What the demo does and when: sample data, the runs it starts, the signals it sends.

A scenario is a timeline of actions (seconds from the start). Every run it starts is
tracked with the status it is designed to end in and why, so the demo can tell a run that
ended as designed from one that did not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Model

from pgbus_workflows import Workflow

from ..gallery.models import Album, Image
from ..gallery.workflows import AlbumProcessing, GalleryImport
from ..shop.models import CarrierBooking, Order
from ..shop.workflows import OrderFulfilment, SalesReport, order_function
from ..signup.models import Signup
from ..signup.workflows import SignupDrip

WORKFLOWS: tuple[type[Workflow], ...] = (
    SignupDrip,
    OrderFulfilment,
    order_function,
    AlbumProcessing,
    GalleryImport,
    SalesReport,
)
ACTOR = "demo"
#: The schedule the demo adds at run time (and pauses when its timeline is over).
REPORT_SCHEDULE = "demo: every 2 seconds"


@dataclass
class Tracked:
    """A run the demo started, and how it is designed to end."""

    label: str
    workflow_class: str
    run_pk: int
    workflow_id: str
    expected: str
    story: str = ""


@dataclass
class Action:
    """Something that happens ``at`` seconds into the demo."""

    at: float
    run: Callable[[], str | None]


@dataclass
class Scenario:
    """The timeline, and the runs started so far."""

    actions: list[Action] = field(default_factory=list)
    tracked: list[Tracked] = field(default_factory=list)

    def at(self, seconds: float, run: Callable[[], str | None]) -> None:
        """Do ``run`` at ``seconds``; what it returns is printed in the feed."""
        self.actions.append(Action(seconds, run))

    def start(
        self,
        workflow: type[Workflow],
        subject: Model,
        label: str,
        expected: str = "finished",
        story: str = "",
        **arguments: Any,
    ) -> Any:
        """Start a run about ``subject`` (idempotently, as a request handler would) and track it."""
        key = f"{workflow.name}-{subject._meta.label_lower}-{subject.pk}"
        handle = workflow.start(subject, idempotency_key=key, **arguments)
        record = handle.record
        self.tracked.append(Tracked(label, workflow.name, record.pk, str(record.workflow_id), expected, story))
        return handle

    def last_action_at(self) -> float:
        """When the last action happens."""
        return max((a.at for a in self.actions), default=0.0)


def reset() -> int:
    """Delete the sample rows and the example workflows' runs of an earlier demo; returns the runs deleted."""
    from pgbus_workflows.models import WorkflowRun, WorkflowSchedule

    WorkflowSchedule.objects.filter(workflow_class=SalesReport.name, name=REPORT_SCHEDULE).delete()
    _, deleted = WorkflowRun.objects.filter(workflow_class__in=[w.name for w in WORKFLOWS]).delete()
    for model in (CarrierBooking, Order, Signup, Album):
        model.objects.all().delete()
    return deleted.get(WorkflowRun._meta.label, 0)


# -- the people, orders and albums -----------------------------------------------------------

NAMES = [
    "Ada Lovelace", "Grace Hopper", "Linus Torvalds", "Margaret Hamilton", "Alan Turing", "Barbara Liskov",
    "Dennis Ritchie", "Frances Allen", "Ken Thompson", "Radia Perlman", "Donald Knuth", "Katherine Johnson",
    "Edsger Dijkstra", "Hedy Lamarr", "John Backus", "Sophie Wilson",
]  # fmt: skip
POSTCODES = ["10115", "75001", "SW1A 1AA", "1012 JS", "00184", "8001", "1050", "EH1 1YZ"]
SIZES = [(4032, 3024), (3024, 4032), (1920, 1080), (800, 800), (6000, 4000), (1080, 1920)]
ALBUMS = ["Team offsite", "Product shots", "Launch party", "Office plants"]


def _signup(index: int, *, opt_in: bool, paid: bool) -> Signup:
    name = NAMES[index % len(NAMES)]
    email = f"{name.split()[0].lower()}{index + 1}@example.com"
    plan = Signup.Plan.PAID if paid else Signup.Plan.TRIAL
    return Signup.objects.create(email=email, name=name, plan=plan, marketing_opt_in=opt_in)


def _order(index: int, *, postcode: bool = True) -> Order:
    name = NAMES[(index + 5) % len(NAMES)]
    return Order.objects.create(
        number=f"A-{1001 + index}",
        customer_email=f"{name.split()[0].lower()}@example.com",
        total_cents=1900 + 1000 * (index % 7),
        postcode=POSTCODES[index % len(POSTCODES)] if postcode else "",
    )


def _album(index: int, images: int, broken: int | None = None) -> Album:
    album = Album.objects.create(title=ALBUMS[index % len(ALBUMS)])
    for n in range(images):
        width, height = (0, 0) if n == broken else SIZES[(index + n) % len(SIZES)]
        data = hashlib.sha256(f"{album.pk}-{n}".encode()).digest() * 64  # 2 KB of "pixels"
        Image.objects.create(
            album=album, filename=f"IMG_{4000 + 10 * index + n}.jpg", data=data, width=width, height=height
        )
    return album


def _pay(order: Order, *, twice: bool = False, workflow: type[Workflow] = OrderFulfilment) -> Callable[[], str]:
    """The payment provider's webhook: one signal per payment, keyed by its reference, to ``workflow``'s run."""

    def deliver() -> str:
        reference = f"pi_{order.number.replace('-', '').lower()}"
        payload: dict[str, Any] = {"amount_cents": order.total_cents, "reference": reference}
        signal = workflow.signal_for(
            order,
            "payment_received",
            payload=payload,
            idempotency_key=reference,
            actor="payment-webhook",
            missing="ignore",
        )
        if signal is None:
            return f"payment webhook: {order} paid, but its run is over: refund it"
        line = f"payment webhook: {order} paid {order.total_cents / 100:.2f} (signal payment_received)"
        if twice:
            again = workflow.signal_for(
                order, "payment_received", payload=payload, idempotency_key=reference, actor="payment-webhook"
            )
            if again is not None and again.duplicate_delivery:
                line += "; delivered again, ignored as a duplicate"
        return line

    return deliver


def _unsubscribe(signup: Signup) -> Callable[[], str]:
    def act() -> str:
        Signup.objects.filter(pk=signup.pk).update(unsubscribed=True)
        return f"{signup.name} unsubscribed: cancel_if() cancels the drip before its next email"

    return act


def _schedule_reports() -> str:
    SalesReport.add_schedule(every=timedelta(seconds=2), name=REPORT_SCHEDULE, actor=ACTOR)
    return "sales report scheduled every 2 seconds (add_schedule): the dispatcher's leader fires each tick"


def _stop_reports(scenario: Scenario) -> Callable[[], str]:
    """Pause the demo's schedule and track the runs it started (the demo fails when it started none)."""

    def act() -> str:
        from pgbus_workflows.models import WorkflowSchedule
        from pgbus_workflows.services import schedules

        schedule = WorkflowSchedule.objects.get(workflow_class=SalesReport.name, name=REPORT_SCHEDULE)
        schedules.pause(schedule.pk, actor=ACTOR, reason="the demo's timeline is over")
        runs = list(schedule.runs.order_by("scheduled_for"))
        for run in runs:
            label = f"sales report for {run.scheduled_for:%H:%M:%S}"
            scenario.tracked.append(Tracked(label, SalesReport.name, run.pk, str(run.workflow_id), "finished"))
        if not runs:
            scenario.tracked.append(Tracked("sales report", SalesReport.name, 0, "", "finished", "never fired"))
        ticks = ", ".join(f"{run.scheduled_for:%H:%M:%S}" for run in runs)
        return f"the schedule fired {len(runs)} sales report(s) (ticks {ticks or 'none'}); paused it"

    return act


# -- the timelines ---------------------------------------------------------------------------


def quick(scenario: Scenario) -> None:
    """Everything at once, then the signals: about ten seconds."""

    def signups() -> str:
        ada = _signup(0, opt_in=True, paid=False)
        grace = _signup(1, opt_in=False, paid=False)
        linus = _signup(2, opt_in=True, paid=True)
        margaret = _signup(3, opt_in=True, paid=False)
        for person in (ada, grace, linus):
            scenario.start(SignupDrip, person, person.name)
        scenario.start(SignupDrip, margaret, margaret.name, "cancelled", "unsubscribed: cancel_if")
        scenario.at(1.0, _unsubscribe(margaret))
        return "4 sign-ups: welcome email now, tips and an upgrade offer later (skip_if: no opt-in, already paid)"

    def orders() -> str:
        paid_early, paid, unpaid, no_postcode = _order(0), _order(1), _order(2), _order(3, postcode=False)
        scenario.start(OrderFulfilment, paid_early, str(paid_early))
        scenario.start(OrderFulfilment, paid, str(paid))
        scenario.start(OrderFulfilment, unpaid, str(unpaid), "cancelled", "never paid: wait_timeout")
        scenario.start(OrderFulfilment, no_postcode, str(no_postcode), "paused", "no postcode: waits for an operator")
        scenario.at(0.2, _pay(paid_early))  # before the run waits: the signal waits for the step
        scenario.at(1.0, _pay(paid, twice=True))
        scenario.at(1.5, _pay(no_postcode))
        coded, coded_unpaid = _order(4), _order(5)
        scenario.start(order_function, coded, f"{coded} (function)")
        scenario.start(order_function, coded_unpaid, f"{coded_unpaid} (function)", story="never paid: released")
        scenario.at(1.2, _pay(coded, workflow=order_function))
        return "6 orders, 2 as a durable function: they wait for their payment; the carrier is flaky"

    def albums() -> str:
        offsite, products = _album(0, images=6, broken=4), _album(1, images=4)
        scenario.start(AlbumProcessing, offsite, f"album {offsite}", story="1 broken image skipped")
        scenario.start(AlbumProcessing, products, f"album {products}")
        launch, plants = _album(2, images=3), _album(3, images=2)
        importer = _signup(4, opt_in=False, paid=True)
        scenario.start(
            GalleryImport, importer, f"{importer.name}'s import", story="2 child albums", albums=[launch.pk, plants.pk]
        )
        return "2 albums: one thumbnail job per image (fan_out), then publish; an import of 2 more as child runs"

    scenario.at(0.0, signups)
    scenario.at(0.0, orders)
    scenario.at(0.0, albums)
    scenario.at(0.0, _schedule_reports)
    scenario.at(5.0, _stop_reports(scenario))


def full(scenario: Scenario) -> None:
    """A minute of traffic: sign-ups every 3 s, orders every 4 s, an album every 12 s."""
    for i in range(14):

        def signup(i: int = i) -> str:
            opt_in, paid, leaves = i % 5 != 1, i % 4 == 2, i in (3, 8, 12)
            person = _signup(i, opt_in=opt_in, paid=paid)
            if leaves:
                scenario.start(SignupDrip, person, person.name, "cancelled", "unsubscribed: cancel_if")
                scenario.at(3.0 * i + 1.0, _unsubscribe(person))
            else:
                scenario.start(SignupDrip, person, person.name)
            extras = [w for w, on in (("no tips", not opt_in), ("paid", paid)) if on]
            return f"{person.name} signed up" + (f" ({', '.join(extras)})" if extras else "")

        scenario.at(3.0 * i, signup)
    for i in range(11):

        def order(i: int = i) -> str:
            unpaid, no_postcode = i in (2, 7), i == 4
            workflow = order_function if i in (1, 6, 9) else OrderFulfilment  # the same order, written as code
            placed = _order(i, postcode=not no_postcode)
            if unpaid:
                scenario.start(OrderFulfilment, placed, str(placed), "cancelled", "never paid: wait_timeout")
            elif no_postcode:
                scenario.start(OrderFulfilment, placed, str(placed), "paused", "no postcode: waits for an operator")
            else:
                scenario.start(workflow, placed, str(placed) + (" (function)" if workflow is order_function else ""))
            if not unpaid:
                scenario.at(4.0 * i + 0.5 + (i % 3), _pay(placed, twice=i == 5, workflow=workflow))
            return f"{placed} placed ({placed.total_cents / 100:.2f})" + (" without a postcode" if no_postcode else "")

        scenario.at(4.0 * i + 0.5, order)
    for i in range(4):

        def album(i: int = i) -> str:
            created = _album(i, images=8 + 3 * i, broken=5 if i == 1 else None)
            story = "1 broken image skipped" if i == 1 else ""
            scenario.start(AlbumProcessing, created, f"album {created}", story=story)
            return f"album {created} uploaded with {created.images.count()} images"

        scenario.at(12.0 * i + 2.0, album)

    def gallery_import() -> str:
        albums = [_album(4 + n, images=3 + n) for n in range(3)]
        importer = _signup(20, opt_in=False, paid=True)
        scenario.start(
            GalleryImport, importer, f"{importer.name}'s import", story="3 child albums", albums=[a.pk for a in albums]
        )
        return f"{importer.name} imports 3 albums: one AlbumProcessing child run each"

    scenario.at(20.0, gallery_import)
    scenario.at(0.0, _schedule_reports)
    scenario.at(30.0, _stop_reports(scenario))
